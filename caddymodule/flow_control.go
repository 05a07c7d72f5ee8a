package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/flow/redisgate"
	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// The request headers flow control reads (the Gateway API Inference
// Extension's names). They are honoured only from trusted sources.
const (
	headerFairnessID = "X-Gateway-Inference-Fairness-Id"
	headerObjective  = "X-Gateway-Inference-Objective"
	headerSLOTTFT    = "X-Slo-Ttft-Ms"
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
		return fmt.Errorf("flow_control: max_body_bytes and metrics_interval must be positive")
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

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
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
	restorePool(h.name, h.log)
	cfg, _ := h.flowConfig()
	cfg = cfg.WithDefaults()
	mc := modelmetrics.Config{Interval: time.Duration(h.MetricsInterval)}
	key := stateKey{module: "flow_control", pool: h.name}
	var gc *redisgate.Config
	if h.global() {
		c := h.gateConfig()
		c.OnFallback = fallbackLogger(h.log, h.name)
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
	req.Bytes = r.ContentLength
	if cfg := h.state.config(); cfg.Detector.ConcurrencyMode == flow.ModeTokens || req.Bytes < 0 {
		ri := requestInfoFor(r, h.bodyLimit())
		req.Model = ri.Model
		if req.Bytes < 0 {
			// No Content-Length: count what is held in memory for it (at
			// least the bound, if the body was larger).
			req.Bytes = int64(len(ri.buf))
		}
		req.Tokens = ri.estimatedTokens()
	}
	ticket, err := h.state.ctl().Enqueue(r.Context(), req)
	if err != nil {
		if rf, ok := refusalFor(err, time.Second); ok {
			caddyhttp.SetVar(r.Context(), refusedVar, rf.Type)
			rf.write(w)
		}
		return nil // refused, or the client left while queued
	}
	defer ticket.Release()
	return next.ServeHTTP(w, r)
}

// findReplicas runs when the config starts, once every module is
// provisioned: it finds the reverse_proxy this handler guards — the first
// one after it in its server's routes — and keeps its static upstreams,
// which then count as the pool's replicas while the pool has no managed
// backend set (as the Sluice policies pick among them). It refuses a
// config where the count cannot be known, naming what to add.
func (h *FlowControl) findReplicas() error {
	h.static = nil
	app, err := h.ctx.AppIfConfigured("http")
	if err != nil {
		return nil // no HTTP app: nothing proxies through this handler
	}
	var mine *reverseproxy.Handler
	var same []*reverseproxy.Handler // those after the other blocks on this pool
	found := false
	forEachChain(app.(*caddyhttp.App), func(chain []caddyhttp.MiddlewareHandler) {
		for i, mh := range chain {
			fc, ok := mh.(*FlowControl)
			if !ok || fc.name != h.name || fc.Replicas > 0 {
				continue
			}
			rp := nextProxy(chain[i+1:])
			if fc == h {
				found, mine = true, rp
			} else {
				same = append(same, rp)
			}
		}
	})
	if !found {
		return nil
	}
	if h.Replicas > 0 {
		// The count is fixed; the static upstreams are still the replicas
		// the utilization detector scrapes.
		if mine != nil && mine.DynamicUpstreams == nil {
			h.static = staticBackends(mine.Upstreams)
		}
		return nil
	}
	name := h.name
	if mine == nil {
		if !lb.GetPool(name).Managed() {
			h.log.Warn("flow_control: no reverse_proxy follows it and its pool has no backend set: "+
				"max_concurrency bounds everything after it (set replicas N to change that)", zap.String("pool", name))
		}
		return nil
	}
	if mine.DynamicUpstreams != nil {
		if src, ok := mine.DynamicUpstreams.(*CustomRouterUpstreams); ok {
			if p := poolName(src.Pool); p != name {
				return fmt.Errorf("flow_control %s: the reverse_proxy after it takes its upstreams from pool %q, "+
					"so flow control would count the wrong replicas: write flow_control %s, or set replicas N", name, p, p)
			}
			return nil // follows the pool's backend set
		}
		if lb.GetPool(name).Managed() {
			return nil
		}
		return fmt.Errorf("flow_control %s: no replicas known: the reverse_proxy after it has dynamic upstreams (%s) "+
			"flow control cannot count; use dynamic custom_router %s (its backend set), static upstreams, or set replicas N",
			name, moduleName(mine.DynamicUpstreams), name)
	}
	for _, rp := range same {
		if rp != nil && rp.DynamicUpstreams == nil && len(rp.Upstreams) != len(mine.Upstreams) {
			return fmt.Errorf("flow_control %s: two blocks on this pool guard reverse_proxies with %d and %d upstreams; "+
				"give one of them another pool, or set replicas N", name, len(mine.Upstreams), len(rp.Upstreams))
		}
	}
	h.static = staticBackends(mine.Upstreams)
	if lbp := mine.LoadBalancing; lbp != nil {
		if _, random := lbp.SelectionPolicy.(*reverseproxy.RandomSelection); random {
			// Flow control decides when, not where: measured (flow-new-user),
			// random sends the request a freed slot lets in to a busy
			// replica 3 times in 4 with one-at-a-time replicas.
			h.log.Warn("flow_control: the reverse_proxy after it picks replicas at random (Caddy's default), so a request "+
				"flow control lets in can land on a busy replica while another is idle; use lb_policy least_conn or a Sluice policy",
				zap.String("pool", name))
		}
	}
	return nil
}

func moduleName(v any) string {
	if m, ok := v.(caddy.Module); ok {
		return string(m.CaddyModule().ID)
	}
	return fmt.Sprintf("%T", v)
}

// forEachChain calls fn with each server's handlers in the order a request
// meets them (subroutes flattened in place), and the same for its error
// routes and named routes.
func forEachChain(app *caddyhttp.App, fn func([]caddyhttp.MiddlewareHandler)) {
	for _, srv := range app.Servers {
		lists := []caddyhttp.RouteList{srv.Routes}
		if srv.Errors != nil {
			lists = append(lists, srv.Errors.Routes)
		}
		for _, r := range srv.NamedRoutes {
			lists = append(lists, caddyhttp.RouteList{*r})
		}
		for _, l := range lists {
			fn(flatten(l, nil))
		}
	}
}

func flatten(routes caddyhttp.RouteList, out []caddyhttp.MiddlewareHandler) []caddyhttp.MiddlewareHandler {
	for _, rt := range routes {
		for _, mh := range rt.Handlers {
			out = append(out, mh)
			if sr, ok := mh.(*caddyhttp.Subroute); ok {
				out = flatten(sr.Routes, out)
			}
		}
	}
	return out
}

// nextProxy is the first reverse_proxy in chain, nil if none.
func nextProxy(chain []caddyhttp.MiddlewareHandler) *reverseproxy.Handler {
	for _, mh := range chain {
		if rp, ok := mh.(*reverseproxy.Handler); ok {
			return rp
		}
	}
	return nil
}

// maxSLOTTFT bounds x-slo-ttft-ms (a day): larger values overflow a
// duration and mean "no SLO" anyway.
const maxSLOTTFT = 24 * time.Hour

// trustedFlowHeaders reads the flow-control headers of a trusted request:
// tenant, priority (through the objectives) and SLO. A fairness id that
// cannot be a label is an error; an unparsable or absurd SLO is ignored.
func trustedFlowHeaders(hdr http.Header, objectives flow.Objectives) (flow.Request, error) {
	req := flow.Request{FlowID: hdr.Get(headerFairnessID)}
	if !flow.ValidFlowID(req.FlowID) {
		return req, fmt.Errorf("%s must be valid UTF-8 of at most %d bytes", headerFairnessID, flow.MaxLabelBytes)
	}
	req.Priority = objectives.Priority(hdr.Get(headerObjective))
	if ms, err := strconv.ParseFloat(hdr.Get(headerSLOTTFT), 64); err == nil && ms > 0 && ms <= float64(maxSLOTTFT/time.Millisecond) {
		req.SLOTTFT = time.Duration(ms * float64(time.Millisecond))
	}
	return req, nil
}

// isTrusted reports whether the request comes from a trusted source:
// its strict client IP (see clientIP) in one of TrustedSources.
func (h *FlowControl) isTrusted(r *http.Request) bool {
	if len(h.trusted) == 0 {
		return false
	}
	ip, ok := clientIP(r)
	if !ok {
		return false
	}
	for _, p := range h.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// clientIP is the client as flow control trusts it. From a peer that is
// not one of the server's trusted_proxies, the peer itself. From a trusted
// proxy, Caddy's own client IP when the server parses strictly
// (trusted_proxies_strict); otherwise the right-most address of the
// client IP headers — what the trusted proxy saw connect to it — not the
// left-most one, which any client can write.
func clientIP(r *http.Request) (netip.Addr, bool) {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	ip := peer.Addr().Unmap()
	ctx := r.Context()
	srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if trusted, _ := caddyhttp.GetVar(ctx, caddyhttp.TrustedProxyVarKey).(bool); !trusted || srv == nil {
		return ip, true
	}
	if srv.TrustedProxiesStrict > 0 {
		if s, _ := caddyhttp.GetVar(ctx, caddyhttp.ClientIPVarKey).(string); s != "" {
			if a, err := netip.ParseAddr(s); err == nil {
				return a.Unmap(), true
			}
		}
		return ip, true
	}
	headers := srv.ClientIPHeaders
	if len(headers) == 0 {
		headers = []string{"X-Forwarded-For"}
	}
	for _, name := range headers {
		vals := r.Header.Values(name)
		if len(vals) == 0 {
			continue
		}
		last := vals[len(vals)-1]
		last = strings.TrimSpace(last[strings.LastIndex(last, ",")+1:])
		if a, err := netip.ParseAddr(last); err == nil {
			return a.Unmap(), true
		}
		return netip.Addr{}, false // a malformed header from a trusted proxy: trust nothing
	}
	return ip, true
}

// flowState is one pool's controller, its detector inputs and a metrics
// scraper (used by the utilization detector).
type flowState struct {
	mu      sync.Mutex
	c       *flow.Controller
	cfg     atomic.Pointer[flow.Config]
	scraper *modelmetrics.Scraper
	// view is where the replicas come from: the pool's managed set, or
	// what the running config fixed (replicas N, static upstreams).
	view atomic.Pointer[replicaView]
	// gate, when set, shares the pool's capacity with the other
	// instances through Redis.
	gate    *redisgate.Gate
	unwatch func()
	stop    context.CancelFunc
	wg      sync.WaitGroup
	name    string
}

// replicaView is what flow control knows of the pool's replicas.
type replicaView struct {
	managed bool
	set     []lb.Backend // the pool's backend set (managed)
	count   int          // replicas N from the config (0: not set)
	static  []lb.Backend // the reverse_proxy's static upstreams
}

// backends are the replicas to watch: the managed set, else the static
// upstreams.
func (v *replicaView) backends() []lb.Backend {
	if v.managed {
		return v.set
	}
	return v.static
}

// replicas is the count the concurrency detector multiplies
// max_concurrency by. With nothing known (an empty set, a config that
// proxies nothing) it is 1: max_concurrency then bounds the whole pool.
func (v *replicaView) replicas() int {
	if v.count > 0 {
		return v.count
	}
	return max(len(v.backends()), 1)
}

func newFlowState(name string, cfg flow.Config, mc modelmetrics.Config, gc *redisgate.Config) (*flowState, error) {
	st := &flowState{name: name, scraper: modelmetrics.New(mc)}
	st.view.Store(&replicaView{})
	if gc != nil {
		// A wrong password or a user lacking a command is configuration:
		// refuse the load (Redis unreachable is not: the gate falls back).
		if err := redisgate.CheckAccess(context.Background(), *gc); err != nil {
			return nil, err
		}
		g, err := redisgate.New(*gc)
		if err != nil {
			return nil, err
		}
		st.gate = g
	}
	if err := st.configure(cfg, mc); err != nil {
		if st.gate != nil {
			st.gate.Close()
		}
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	st.stop = cancel
	st.wg.Add(1)
	go func() { defer st.wg.Done(); st.scraper.Run(ctx) }()
	st.unwatch = lb.GetPool(name).Watch(func(set []lb.Backend, managed bool) {
		st.updateView(func(v *replicaView) { v.managed, v.set = managed, set })
	})
	return st, nil
}

// setFixed applies what the starting config fixed: replicas N and the
// static upstreams found after the handler.
func (st *flowState) setFixed(count int, static []lb.Backend) {
	st.updateView(func(v *replicaView) { v.count, v.static = count, static })
}

// updateView changes the view, points the scraper at the replicas and
// lets the controller use a changed capacity at once.
func (st *flowState) updateView(change func(*replicaView)) {
	st.mu.Lock()
	v := *st.view.Load()
	change(&v)
	st.view.Store(&v)
	targets := map[string]string{}
	for _, b := range v.backends() {
		targets[b.Dial] = b.URL
	}
	st.scraper.SetTargets(targets)
	c := st.c
	st.mu.Unlock()
	if c != nil {
		c.Kick()
	}
}

// Settings implements sharedState.
func (st *flowState) Settings() any {
	s := map[string]any{"Config": st.config(), "MetricsInterval": st.scraper.Config().Interval,
		"Replicas": st.view.Load().replicas()}
	if st.gate != nil {
		gc := st.gate.Config()
		s["Redis"], s["LeaseTTL"], s["FallbackShare"], s["Global"] = gc.Conn.Redacted(), gc.LeaseTTL, gc.FallbackShare, st.gate.Stats()
	}
	return s
}

// fallbackLogger logs the gate entering and leaving its fallback share.
func fallbackLogger(log *zap.Logger, pool string) func(error) {
	return func(err error) {
		if err != nil {
			log.Error("flow_control: Redis unreachable: dispatching against this instance's fallback share of the pool until it answers",
				zap.String("pool", pool), zap.Error(err))
			return
		}
		log.Info("flow_control: Redis answers again: back on the pool-wide count", zap.String("pool", pool))
	}
}

// flowGates maps each pool to the gate of its live shared flow control.
func flowGates() map[string]*redisgate.Gate {
	out := map[string]*redisgate.Gate{}
	sharedStates.Range(func(k, v any) bool {
		if key := k.(stateKey); key.module == "flow_control" {
			if g := v.(*flowState).gate; g != nil {
				out[key.pool] = g
			}
		}
		return true
	})
	return out
}

func (st *flowState) ctl() *flow.Controller {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.c
}

func (st *flowState) config() flow.Config { return *st.cfg.Load() }

// detector builds the saturation detector cfg asks for, over the replicas
// of the view (see replicaView).
func (st *flowState) detector(cfg flow.Config) flow.SaturationDetector {
	if cfg.Detector.Type == flow.DetectorUtilization {
		replicas := func() []string { return lb.Dials(st.view.Load().backends()) }
		return flow.NewUtilizationDetector(cfg.Detector, flow.ScraperLoads(st.scraper, replicas), nil)
	}
	local := flow.NewConcurrencyDetector(cfg.Detector, func() int { return st.view.Load().replicas() })
	if st.gate != nil {
		st.gate.SetLocal(local)
		return st.gate
	}
	return local
}

func (st *flowState) configure(cfg flow.Config, mc modelmetrics.Config) error {
	cfg = cfg.WithDefaults()
	st.scraper.Configure(mc)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.cfg.Store(&cfg)
	if st.c == nil {
		c, err := flow.New(cfg, st.detector(cfg))
		if err != nil {
			return err
		}
		c.SetObserver(flowCollector.Observer(st.name))
		st.c = c
		if st.gate != nil {
			st.gate.Attach(c)
		}
		return nil
	}
	return st.c.Reconfigure(cfg, st.detector(cfg))
}

// Destruct implements caddy.Destructor: queued requests get 500 shutdown.
func (st *flowState) Destruct() error {
	st.unwatch()
	if c := st.ctl(); c != nil {
		c.Close()
	}
	if st.gate != nil {
		st.gate.Close()
	}
	st.stop()
	st.wg.Wait()
	return nil
}

func flowControllers() map[string]*flow.Controller {
	out := map[string]*flow.Controller{}
	for pool, st := range liveStates("flow_control") {
		if c := st.(*flowState).ctl(); c != nil {
			out[pool] = c
		}
	}
	return out
}

// UnmarshalCaddyfile sets up the handler from:
//
//	flow_control [<pool>] {
//	    pool                  <name>
//	    trusted_sources       <cidr|ip>...
//	    objective             <name> <priority>      # repeatable
//	    max_requests          <n>
//	    max_bytes             <quantity>             # 10Gi, 512Mi, 1k, 1000
//	    default_ttl           <duration>
//	    band <priority> {                            # repeatable
//	        name         <name>
//	        max_requests <n>
//	        max_bytes    <quantity>
//	        fairness     round_robin|global_strict
//	        ordering     fcfs|edf|slo_deadline
//	        ttl          <duration>
//	    }
//	    detector              concurrency|utilization
//	    max_concurrency       <n per replica>
//	    concurrency_mode      requests|tokens
//	    max_token_concurrency <n per replica>
//	    headroom              <0..1>
//	    queue_depth_threshold <n>
//	    kv_cache_threshold    <0..1>
//	    metrics_staleness     <duration>
//	    metrics_interval      <duration>
//	    max_body_bytes        <bytes>
//	    replicas              <n>                    # default: the backend set, else the reverse_proxy's upstreams
//	    redis                 <host:port>...         # count in flight across instances (and the other Redis options)
//	    lease_ttl             <duration>
//	    fallback_share        <0..1>
//	}
func (h *FlowControl) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseModule(d, "flow_control", &h.Pool, h, func(opt string, vals []string) (bool, error) {
		switch opt {
		case "objective":
			if len(vals) != 2 {
				return true, fmt.Errorf("takes a name and a priority")
			}
			p, err := strconv.Atoi(vals[1])
			if err != nil {
				return true, fmt.Errorf("%s: bad priority %q", vals[0], vals[1])
			}
			if h.Objectives == nil {
				h.Objectives = map[string]int{}
			}
			h.Objectives[vals[0]] = p
		case "band":
			b, err := parseBand(d, vals)
			if err != nil {
				return true, err
			}
			h.Bands = append(h.Bands, b)
		default:
			return false, nil
		}
		return true, nil
	})
}

// parseBand parses `band <priority> { <option> <value> ... }`.
func parseBand(d *caddyfile.Dispenser, vals []string) (FlowBand, error) {
	if len(vals) != 1 {
		return FlowBand{}, fmt.Errorf("takes its priority, then a block")
	}
	p, err := strconv.Atoi(vals[0])
	if err != nil {
		return FlowBand{}, fmt.Errorf("bad priority %q", vals[0])
	}
	b := FlowBand{Priority: p}
	for nest := d.Nesting(); d.NextBlock(nest); {
		opt := d.Val()
		if err := setOption(&b, opt, d.RemainingArgs()); err != nil {
			return b, fmt.Errorf("%d: %s: %v", p, opt, err)
		}
	}
	return b, nil
}
