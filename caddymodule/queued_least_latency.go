package caddymodule

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/qll"
)

func init() {
	caddy.RegisterModule(QueuedLeastLatency{})
}

// QueuedLeastLatency is Hugging Face's queued-least-latency router as a
// reverse_proxy selection policy: requests wait in one FIFO queue at the
// edge and are dispatched late to the replica with the lowest predicted
// latency. Its state (queue, EWMAs, in-flight counts) belongs to the pool,
// not to this config instance, so a reload keeps it.
type QueuedLeastLatency struct {
	// Pool whose backend set and state this policy uses (default "default").
	Pool string `json:"pool,omitempty"`
	// Highest predicted latency at which a replica still gets a request
	// (default 3s). An idle replica is always eligible.
	LatencyThreshold caddy.Duration `json:"latency_threshold,omitempty"`
	// Weight of each new latency sample, in (0, 1] (default 0.3).
	EWMAAlpha float64 `json:"ewma_alpha,omitempty"`
	// Queue bound (default 1000); when full the oldest waiter is dropped
	// with 503. -1 disables queueing (429 when every replica is busy).
	QueueMaxSize int `json:"queue_max_size,omitempty"`
	// Longest wait in the queue (default 1200s), then 503.
	QueueTimeout caddy.Duration `json:"queue_timeout,omitempty"`
	// Interval of the per-replica state log line (default 30s; -1 disables).
	StateLogInterval caddy.Duration `json:"state_log_interval,omitempty"`
	// Cap on in-flight requests per replica (default 0: none).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// Requests a replica serves at once without slowing (default 1; the
	// batch size for LLM servers).
	Parallelism int `json:"parallelism,omitempty"`
	// Consecutive failures that mark a replica down (default 1), and for
	// how long (default 5s, doubling per further failure up to 16×).
	MaxFails     int            `json:"max_fails,omitempty"`
	FailDuration caddy.Duration `json:"fail_duration,omitempty"`
	// Which latency feeds the EWMA: auto (default: first byte for
	// text/event-stream, last byte otherwise), last_byte or first_byte.
	LatencyMeasure string `json:"latency_measure,omitempty"`

	state   *qll.State
	pool    *lb.Pool
	varKey  string
	measure latencyMeasure
	log     *zap.Logger
	stopLog chan struct{}
}

// CaddyModule returns the Caddy module information.
func (QueuedLeastLatency) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.queued_least_latency",
		New: func() caddy.Module { return new(QueuedLeastLatency) },
	}
}

func (p *QueuedLeastLatency) config() qll.Config {
	return qll.Config{
		LatencyThreshold: time.Duration(p.LatencyThreshold),
		EWMAAlpha:        p.EWMAAlpha,
		QueueMaxSize:     p.QueueMaxSize,
		QueueTimeout:     time.Duration(p.QueueTimeout),
		MaxConcurrency:   p.MaxConcurrency,
		Parallelism:      p.Parallelism,
		MaxFails:         p.MaxFails,
		FailDuration:     time.Duration(p.FailDuration),
	}
}

// Validate implements caddy.Validator.
func (p *QueuedLeastLatency) Validate() error {
	if err := validatePoolName(poolName(p.Pool)); err != nil {
		return fmt.Errorf("queued_least_latency: %v", err)
	}
	if p.QueueMaxSize < -1 {
		return fmt.Errorf("queued_least_latency: queue_max_size must be -1 (no queue) or more, got %d", p.QueueMaxSize)
	}
	switch latencyMeasure(p.LatencyMeasure) {
	case "", measureAuto, measureLastByte, measureFirstByte:
	default:
		return fmt.Errorf("queued_least_latency: latency_measure must be auto, last_byte or first_byte, got %q", p.LatencyMeasure)
	}
	if err := p.config().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("queued_least_latency: %v", err)
	}
	return nil
}

// Provision implements caddy.Provisioner: it attaches to the pool's state
// (creating it on first use), applies this config to it, and starts the
// state log.
func (p *QueuedLeastLatency) Provision(ctx caddy.Context) error {
	p.log = ctx.Logger()
	if err := p.Validate(); err != nil {
		return err
	}
	name := poolName(p.Pool)
	p.measure = latencyMeasure(p.LatencyMeasure)
	if p.measure == "" {
		p.measure = measureAuto
	}
	restorePool(name, p.log)
	p.pool = lb.GetPool(name)
	p.varKey = "sluice.qll." + name
	val, _, err := qllStates.LoadOrNew(name, func() (caddy.Destructor, error) {
		return newPoolState(name, p.config()), nil
	})
	if err != nil {
		return err
	}
	p.state = val.(*poolState).State
	p.state.Configure(p.config())
	registerMetrics(ctx, p.log)

	interval := time.Duration(p.StateLogInterval)
	if interval == 0 {
		interval = 30 * time.Second
	}
	if interval > 0 {
		p.stopLog = make(chan struct{})
		go p.logState(interval, name)
	}
	return nil
}

// Cleanup implements caddy.CleanerUpper. The state itself lives on while
// another config (the one replacing this) still uses the pool.
func (p *QueuedLeastLatency) Cleanup() error {
	if p.stopLog != nil {
		close(p.stopLog)
	}
	_, err := qllStates.Delete(poolName(p.Pool))
	return err
}

func (p *QueuedLeastLatency) logState(every time.Duration, pool string) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.stopLog:
			return
		case <-t.C:
			snap := p.state.Snapshot()
			fields := []zap.Field{zap.String("pool", pool), zap.Int("queue_depth", snap.QueueDepth),
				zap.Duration("oldest_wait", snap.OldestWait), zap.Uint64("dispatched", snap.Counters.Dispatched),
				zap.Uint64("evicted", snap.Counters.Evicted), zap.Uint64("timed_out", snap.Counters.TimedOut),
				zap.Uint64("failures", snap.Counters.Failures)}
			for _, r := range snap.Replicas {
				fields = append(fields, zap.String(r.Addr, fmt.Sprintf("ewma=%.3fs in_flight=%d down=%t", r.EWMASeconds, r.InFlight, r.Down)))
			}
			p.log.Info("queued_least_latency state", fields...)
		}
	}
}

// Select implements reverseproxy.Selector. It may block: that is the
// queue. It returns nil after answering the request itself (JSON error,
// Retry-After) when the request cannot be dispatched.
func (p *QueuedLeastLatency) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	a := startAttempt(r, p.varKey, p.measure)
	if a == nil {
		return nil
	}
	if !p.pool.Managed() {
		syncStaticUpstreams(p.state, pool)
	}
	lease, err := p.state.Acquire(r.Context())
	if err != nil {
		if rf, ok := refusalFor(err, p.state.RetryAfter()); ok {
			p.log.Debug("request refused", zap.String("pool", p.pool.Name()), zap.String("reason", rf.Type))
			a.refuse(r, w, rf)
		}
		return nil
	}
	if !a.begin(lease) {
		return nil
	}
	return upstreamFor(pool, lease.Addr)
}

// syncStaticUpstreams makes the reverse_proxy's own upstream list the
// state's backend set, for configs without set-backends.
func syncStaticUpstreams(s *qll.State, pool reverseproxy.UpstreamPool) {
	if s.SameBackends(len(pool), func(i int) string { return pool[i].Dial }) {
		return
	}
	addrs := make([]string, len(pool))
	for i, u := range pool {
		addrs[i] = u.Dial
	}
	s.SetBackends(addrs)
}

// sluiceUpstreams holds upstreams for replicas a request's (stale) pool
// does not list: a request queued before set-backends added a replica can
// still be dispatched to it.
var sluiceUpstreams sync.Map // dial -> *reverseproxy.Upstream

// upstreamFor returns the pool's upstream for dial, so Caddy's own
// per-host counters and health state apply, or a Sluice-made one.
func upstreamFor(pool reverseproxy.UpstreamPool, dial string) *reverseproxy.Upstream {
	for _, u := range pool {
		if u.Dial == dial {
			return u
		}
	}
	if u, ok := sluiceUpstreams.Load(dial); ok {
		return u.(*reverseproxy.Upstream)
	}
	u, _ := sluiceUpstreams.LoadOrStore(dial, &reverseproxy.Upstream{Dial: dial, Host: new(reverseproxy.Host)})
	return u.(*reverseproxy.Upstream)
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens:
//
//	lb_policy queued_least_latency {
//	    pool               <name>
//	    latency_threshold  <duration|seconds>
//	    ewma_alpha         <float>
//	    queue_max_size     <int>
//	    queue_timeout      <duration|seconds>
//	    state_log_interval <duration|seconds>
//	    max_concurrency    <int>
//	    parallelism        <int>
//	    max_fails          <int>
//	    fail_duration      <duration|seconds>
//	    latency_measure    auto|last_byte|first_byte
//	}
//
// Durations also accept plain seconds ("3.0"), as the reference's
// CUSTOM_ROUTER_* variables are written, so `{$CUSTOM_ROUTER_LATENCY_THRESHOLD:3}`
// works as a value.
func (p *QueuedLeastLatency) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseOptionBlock(d, "queued_least_latency", func(opt, val string) (err error) {
		switch opt {
		case "pool":
			p.Pool = val
		case "latency_threshold":
			p.LatencyThreshold, err = parseSecondsOrDuration(val)
		case "ewma_alpha":
			p.EWMAAlpha, err = strconv.ParseFloat(val, 64)
			if err == nil && !(p.EWMAAlpha > 0 && p.EWMAAlpha <= 1) {
				err = fmt.Errorf("must be in (0, 1]")
			}
		case "queue_max_size":
			p.QueueMaxSize, err = strconv.Atoi(val)
		case "queue_timeout":
			p.QueueTimeout, err = parseSecondsOrDuration(val)
		case "state_log_interval":
			p.StateLogInterval, err = parseSecondsOrDuration(val)
		case "max_concurrency":
			p.MaxConcurrency, err = atLeast(val, 0)
		case "parallelism":
			p.Parallelism, err = atLeast(val, 1)
		case "max_fails":
			p.MaxFails, err = atLeast(val, 1)
		case "fail_duration":
			p.FailDuration, err = parseSecondsOrDuration(val)
		case "latency_measure":
			p.LatencyMeasure = val
		default:
			return errUnknownOption
		}
		return err
	})
}

// Interface guards
var (
	_ caddy.Provisioner     = (*QueuedLeastLatency)(nil)
	_ caddy.Validator       = (*QueuedLeastLatency)(nil)
	_ caddy.CleanerUpper    = (*QueuedLeastLatency)(nil)
	_ reverseproxy.Selector = (*QueuedLeastLatency)(nil)
	_ caddyfile.Unmarshaler = (*QueuedLeastLatency)(nil)
)
