package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/flow/redisgate"
	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// FlowControl holds requests at the edge while the pool is saturated and
// releases them by priority band, then tenant fairness, then order, so
// the replica is chosen at the last moment. When the pool has capacity,
// requests pass straight through.
type FlowControl struct {
	// Pool whose replicas the detector watches (default "default").
	Pool string `json:"pool,omitempty"`
	// TrustedSources are client IP ranges (CIDR) whose fairness,
	// objective and SLO headers are honoured; from anyone else they are
	// removed before proxying and ignored. Empty: trust nobody.
	TrustedSources []string `json:"trusted_sources,omitempty"`
	// Objectives maps x-gateway-inference-objective values to priorities.
	Objectives map[string]int `json:"objectives,omitempty"`
	// Global limits on what is queued, and the default TTL in the queue.
	MaxRequests int64          `json:"max_requests,omitempty" sluice:"min=0"`
	MaxBytes    string         `json:"max_bytes,omitempty"` // quantity: 10Gi, 1k, 512Mi or an integer
	DefaultTTL  caddy.Duration `json:"default_ttl,omitempty"`
	// Bands configure priority levels; unconfigured priorities get defaults.
	Bands []FlowBand `json:"bands,omitempty"`
	// Detector: "concurrency" (default here: needs no replica metrics) or
	// "utilization" (scrapes the replicas' metrics).
	Detector            string         `json:"detector,omitempty"`
	MaxConcurrency      int64          `json:"max_concurrency,omitempty" sluice:"min=0"` // per replica
	ConcurrencyMode     string         `json:"concurrency_mode,omitempty"`
	MaxTokenConcurrency int64          `json:"max_token_concurrency,omitempty" sluice:"min=0"`
	Headroom            float64        `json:"headroom,omitempty" sluice:"min=0"`
	QueueDepthThreshold float64        `json:"queue_depth_threshold,omitempty" sluice:"min=0"`
	KVCacheThreshold    float64        `json:"kv_cache_threshold,omitempty" sluice:"min=0"`
	MetricsStaleness    caddy.Duration `json:"metrics_staleness,omitempty"`
	MetricsInterval     caddy.Duration `json:"metrics_interval,omitempty"`
	// Replicas fixes the replica count the concurrency detector multiplies
	// max_concurrency by. 0: the pool's managed backend set, else the
	// static upstreams of the reverse_proxy after this handler.
	Replicas int `json:"replicas,omitempty" sluice:"min=0"`
	bodyOptions

	// With redis set, every instance of the pool that uses the same
	// Redis counts against one capacity: each holds a fair share of it
	// in Redis (flow/redisgate) and dispatches against its share, so N
	// instances admit no more than max_concurrency × replicas together.
	// Queues, priority and fairness stay per instance.
	redisConnection
	// LeaseTTL: a crashed instance's share comes back within about this
	// long (default 5s).
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// FallbackShare is the fraction of the capacity an instance
	// dispatches against while Redis is away (default 1/N, N the
	// instances seen at the last answer).
	FallbackShare float64 `json:"fallback_share,omitempty" sluice:"min=0"`

	trusted []netip.Prefix
	state   *flowState
	name    string
	claims  stateClaims
	log     *zap.Logger
	ctx     caddy.Context
	// static is the reverse_proxy's upstream list found when the config
	// started (nil: none, or dynamic ones).
	static []lb.Backend
}

// FlowBand is one priority band.
type FlowBand struct {
	Priority    int            `json:"priority"`
	Name        string         `json:"name,omitempty"`
	MaxRequests int64          `json:"max_requests,omitempty"`
	MaxBytes    string         `json:"max_bytes,omitempty"`
	Fairness    string         `json:"fairness,omitempty"`
	Ordering    string         `json:"ordering,omitempty"`
	TTL         caddy.Duration `json:"ttl,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (FlowControl) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("http.handlers.flow_control", func() caddy.Module { return new(FlowControl) })
}

func (h *FlowControl) flowConfig() (flow.Config, error) {
	cfg := flow.Config{
		MaxRequests: h.MaxRequests,
		DefaultTTL:  time.Duration(h.DefaultTTL),
		Objectives:  flow.Objectives(h.Objectives),
		Detector: flow.DetectorConfig{
			Type: h.Detector, MaxConcurrency: h.MaxConcurrency, ConcurrencyMode: h.ConcurrencyMode,
			MaxTokenConcurrency: h.MaxTokenConcurrency, Headroom: h.Headroom,
			QueueDepthThreshold: h.QueueDepthThreshold, KVCacheThreshold: h.KVCacheThreshold,
			MetricsStaleness: time.Duration(h.MetricsStaleness),
		},
	}
	if cfg.Detector.Type == "" {
		cfg.Detector.Type = flow.DetectorConcurrency
	}
	if h.MaxBytes != "" {
		n, err := flow.ParseQuantity(h.MaxBytes)
		if err != nil {
			return cfg, fmt.Errorf("max_bytes: %v", err)
		}
		cfg.MaxBytes = n
	}
	for i, b := range h.Bands {
		bc := flow.BandConfig{Priority: b.Priority, Name: b.Name, MaxRequests: b.MaxRequests,
			Fairness: b.Fairness, Ordering: b.Ordering, TTL: time.Duration(b.TTL)}
		if bc.Fairness == "" {
			bc.Fairness = "round_robin" // a noisy tenant must not starve the others
		}
		if b.MaxBytes != "" {
			n, err := flow.ParseQuantity(b.MaxBytes)
			if err != nil {
				return cfg, fmt.Errorf("bands[%d].max_bytes: %v", i, err)
			}
			bc.MaxBytes = n
		}
		cfg.Bands = append(cfg.Bands, bc)
	}
	return cfg, cfg.WithDefaults().Validate()
}

// Validate implements caddy.Validator.
func (h *FlowControl) Validate() error {
	if err := validatePoolName(poolName(h.Pool)); err != nil {
		return fmt.Errorf("flow_control: %v", err)
	}
	if _, err := h.flowConfig(); err != nil {
		return fmt.Errorf("flow_control: %v", err)
	}
	for _, s := range h.TrustedSources {
		if _, err := parsePrefix(s); err != nil {
			return fmt.Errorf("flow_control: trusted_sources: %v", err)
		}
	}
	if err := validateBodyAndHealth("flow_control", h.bodyOptions, passiveHealth{}); err != nil {
		return err
	}
	if h.Replicas < 0 {
		return fmt.Errorf("flow_control: replicas: must not be negative, got %d", h.Replicas)
	}
	if h.MetricsInterval < 0 {
		return fmt.Errorf("flow_control: metrics_interval: must be positive, got %v", time.Duration(h.MetricsInterval))
	}
	if err := checkMetricsTiming("flow_control", h.MetricsInterval, h.MetricsStaleness); err != nil {
		return err
	}
	if h.global() {
		if t := h.Detector; t != "" && t != flow.DetectorConcurrency {
			return fmt.Errorf("flow_control: redis: counts the concurrency detector's in-flight requests across instances; "+
				"the %s detector already reads the replicas' own metrics, which every instance sees", t)
		}
		if err := h.gateConfig().WithDefaults().Validate(); err != nil {
			return fmt.Errorf("flow_control: %v", err)
		}
	}
	return nil
}

// global reports whether the capacity is shared through Redis.
func (h *FlowControl) global() bool { return len(h.Redis) > 0 }

func (h *FlowControl) gateConfig() redisgate.Config {
	return redisgate.Config{Conn: h.conn(), Pool: poolName(h.Pool), LeaseTTL: time.Duration(h.LeaseTTL), FallbackShare: h.FallbackShare}
}

// Provision implements caddy.Provisioner. The controller belongs to the
// pool and survives reloads; the new settings reach it when the config
// starts (see App), keeping every queued request (with its original
// deadline).
func (h *FlowControl) Provision(ctx caddy.Context) error {
	h.log, h.ctx = ctx.Logger(), ctx
	if err := h.Validate(); err != nil {
		return err
	}
	for _, s := range h.TrustedSources {
		p, _ := parsePrefix(s)
		h.trusted = append(h.trusted, p.Masked())
	}
	h.name = poolName(h.Pool)
	if err := usePool(ctx, h.name, h.log); err != nil {
		return fmt.Errorf("flow_control: %v", err)
	}
	cfg, _ := h.flowConfig()
	cfg = cfg.WithDefaults()
	mc := modelmetrics.Config{Interval: time.Duration(h.MetricsInterval)}
	key := stateKey{module: "flow_control", pool: h.name}
	var gc *redisgate.Config
	if h.global() {
		c := h.gateConfig()
		c.OnFallback = fallbackLogger(h.log, h.name)
		c.OnRepair = repairLogger(h.log, h.name)
		gc, key.variant = &c, connectionKey(c.Conn.WithDefaults())
	}
	v, err := h.claims.take(key, func() (sharedState, error) { return newFlowState(h.name, cfg, mc, gc) })
	if err != nil {
		return fmt.Errorf("flow_control: %v", err)
	}
	h.state = v.(*flowState)
	st, log := h.state, h.log
	fingerprint := fmt.Sprintf("%+v %+v replicas=%d %s", cfg, mc, h.Replicas, key.variant)
	if gc != nil {
		fingerprint += fmt.Sprintf(" lease_ttl=%v fallback_share=%v read_timeout=%v", gc.LeaseTTL, gc.FallbackShare, gc.Conn.ReadTimeout)
	}
	if err := applyOnStartChecked(ctx, key, fingerprint, h.findReplicas, func() {
		st.setFixed(h.Replicas, h.static)
		mc := mc
		mc.TLS = upstreamTLS(h.guardedProxy()) // its scrapes read the replicas behind that proxy
		if err := st.configure(cfg, mc); err != nil {
			log.Error("cannot apply flow_control settings", zap.String("pool", st.name), zap.Error(err))
		}
		if gc != nil {
			if err := st.gate.Configure(*gc); err != nil {
				log.Error("cannot apply flow_control redis settings", zap.String("pool", st.name), zap.Error(err))
			}
		}
	}); err != nil {
		return fmt.Errorf("flow_control: %v", err)
	}
	registerMetrics(ctx, h.log)
	return nil
}

// Cleanup implements caddy.CleanerUpper: it releases what Provision took.
func (h *FlowControl) Cleanup() error { return h.claims.release() }

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *FlowControl) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	h.state.requests.enter()
	defer h.state.requests.leave()
	req := flow.Request{}
	if h.isTrusted(r) {
		var err error
		if req, err = trustedFlowHeaders(r.Header, h.state.config().Objectives); err != nil {
			writeJSONError(w, http.StatusBadRequest, "invalid_request", err.Error())
			return nil
		}
	} else {
		// Untrusted: a client must not assert its own tenant or priority,
		// nor pass these headers on to the model servers.
		r.Header.Del(headerFairnessID)
		r.Header.Del(headerObjective)
		r.Header.Del(headerSLOTTFT)
	}
	// max_bytes bounds the memory queued requests hold: at most
	// max_body_bytes of a body is read while it waits, the rest stays in
	// the client's socket, so a declared length counts up to that (one
	// client declaring a gigabyte filled the band's budget for everyone).
	req.Bytes = min(r.ContentLength, h.bodyLimit())
	if cfg := h.state.config(); cfg.Detector.ConcurrencyMode == flow.ModeTokens || req.Bytes < 0 {
		ri := requestInfoFor(r, h.bodyLimit(), false) // weighed, not routed on
		req.Model = ri.Model
		if req.Bytes < 0 {
			// No Content-Length: count what is held in memory for it (at
			// least the bound, if the body was larger).
			req.Bytes = int64(len(ri.buf))
		}
		req.Tokens = ri.estimatedTokens()
	} else if req.Bytes > 0 && r.ContentLength <= h.bodyLimit() {
		// A request that waits reads its body (up to the bound, which
		// max_bytes counts anyway): net/http sees an HTTP/1 client close
		// its connection only once the body is read, so an unread one
		// kept a gone client's place in the queue until its TTL and then
		// went to a replica. A body over the bound stays unread. The read
		// stops when the request leaves the queue undispatched: its
		// refusal must not wait for a slow upload (readBodyUntil).
		req.Queued = func(left context.Context) {
			// With the handler's parts: watchBody takes them if it is
			// let in (one allocation, not two).
			handlerStateOf(r).readBodyUntil(left, w, r, h.bodyLimit())
		}
	}
	// Only validated values reach the variables: an untrusted client's
	// headers were removed above, so it shows the shared flow ("") and
	// the default band.
	vars := requestVars(r)
	recordFlow(vars, req.FlowID, h.state.config().BandName(req.Priority))
	queued := time.Now()
	ticket, err := h.state.ctl().Enqueue(r.Context(), req)
	addQueueWait(vars, time.Since(queued))
	if err != nil {
		rf, ok := refusalFor(err, time.Second)
		reason := reasonCancelled
		if ok {
			reason = refusedReason(rf.Type)
		}
		recordDecision(vars, "", reason, 0)
		logDecision(h.log, r, h.name, err)
		if ok {
			caddyhttp.SetVar(r.Context(), refusedVar, rf.Type)
			rf.answer(w, r)
		}
		return nil // refused, or the client left while queued
	}
	defer ticket.Release()
	return next.ServeHTTP(watchBody(w, r), r)
}
