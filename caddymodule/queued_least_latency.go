package caddymodule

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/qll"
)

func init() {
	caddy.RegisterModule(QueuedLeastLatency{})
	registerCollectors(qllCollector)
}

var _ policyModule = (*QueuedLeastLatency)(nil)

// qllCollector exports every live queued_least_latency state.
var qllCollector = qll.NewCollector(func() map[string]*qll.State {
	return pickersOf[*qll.State]("queued_least_latency")
})

// QueuedLeastLatency is Hugging Face's queued-least-latency router as a
// reverse_proxy selection policy: requests wait in one FIFO queue at the
// edge and are dispatched late to the replica with the lowest predicted
// latency. Its state (queue, EWMAs, in-flight counts) belongs to the pool,
// not to this config instance, so a reload keeps it.
type QueuedLeastLatency struct {
	// Pool whose backend set and state this policy uses (default "default").
	Pool string `json:"pool,omitempty"`
	// The Hugging Face router's rule, when set: a busy replica still gets
	// a request while its predicted latency is at or under this. Unset
	// (default, Caddyfile `auto`): replicas get requests only into free
	// slots, learned per replica, and the rest wait at the edge.
	LatencyThreshold caddy.Duration `json:"latency_threshold,omitempty"`
	// Weight of each new latency sample, in (0, 1] (default 0.3).
	EWMAAlpha float64 `json:"ewma_alpha,omitempty"`
	// Queue bound (default 1000); when full the oldest waiter is dropped
	// with 503. -1 disables queueing (429 when every replica is busy).
	QueueMaxSize int `json:"queue_max_size,omitempty" sluice:"min=-1"`
	// Longest wait in the queue (default 1200s), then 503.
	QueueTimeout caddy.Duration `json:"queue_timeout,omitempty"`
	// Interval of the per-replica state log line (default 30s; -1 disables).
	StateLogInterval caddy.Duration `json:"state_log_interval,omitempty"`
	// Cap on in-flight requests per replica (default 0: none).
	MaxConcurrency int `json:"max_concurrency,omitempty" sluice:"min=0"`
	// Pins the requests a replica serves at once without slowing (its
	// free slots). Unset (default, Caddyfile `auto`): learned per replica
	// from its latencies — 1 for one-at-a-time servers, about the batch
	// size for LLM servers.
	Parallelism int `json:"parallelism,omitempty" sluice:"min=1"`
	// Which latency feeds the EWMA: auto (default: first byte for
	// text/event-stream, last byte otherwise), last_byte or first_byte.
	LatencyMeasure string `json:"latency_measure,omitempty"`
	// Whether the replicas' own metrics decide their slots where they
	// export their queue (vLLM, SGLang, TGI, Triton): on (default) or off.
	// On: a request waits at the edge only while the engine says it is
	// full (more requests waiting than a full engine may keep, KV cache
	// full); replicas that export no queue keep the learned limit.
	EngineMetrics string `json:"engine_metrics,omitempty"`
	// How often the replicas' metrics are read (default 1s; again every
	// 50ms while requests wait at the edge), how
	// old a sample may be before it is ignored (default 3× the interval),
	// and their path (default /metrics).
	MetricsInterval  caddy.Duration `json:"metrics_interval,omitempty" sluice:"positive"`
	MetricsStaleness caddy.Duration `json:"metrics_staleness,omitempty" sluice:"positive"`
	MetricsPath      string         `json:"metrics_path,omitempty"`

	passiveHealth
	attemptOptions
	selector
}

// CaddyModule returns the Caddy module information.
func (QueuedLeastLatency) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("http.reverse_proxy.selection_policies.queued_least_latency", func() caddy.Module { return new(QueuedLeastLatency) })
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
		NoEngineMetrics:  p.EngineMetrics == "off",
		EngineMetrics: modelmetrics.Config{Interval: time.Duration(p.MetricsInterval),
			Staleness: time.Duration(p.MetricsStaleness), Path: p.MetricsPath},
	}
}

func (p *QueuedLeastLatency) logInterval() time.Duration {
	if p.StateLogInterval == 0 {
		return 30 * time.Second
	}
	return time.Duration(p.StateLogInterval)
}

// Validate implements caddy.Validator.
func (p *QueuedLeastLatency) Validate() error {
	if err := validatePoolName(poolName(p.Pool)); err != nil {
		return fmt.Errorf("queued_least_latency: %v", err)
	}
	if p.QueueMaxSize < -1 {
		return fmt.Errorf("queued_least_latency: queue_max_size: must be -1 (no queue) or more, got %d", p.QueueMaxSize)
	}
	switch latencyMeasure(p.LatencyMeasure) {
	case "", measureAuto, measureLastByte, measureFirstByte:
	default:
		return fmt.Errorf("queued_least_latency: latency_measure: must be auto, last_byte or first_byte, got %q", p.LatencyMeasure)
	}
	switch p.EngineMetrics {
	case "", "on", "off":
	default:
		return fmt.Errorf("queued_least_latency: engine_metrics: must be on or off, got %q", p.EngineMetrics)
	}
	if p.MetricsPath != "" && p.MetricsPath[0] != '/' {
		return fmt.Errorf("queued_least_latency: metrics_path: must start with /, got %q", p.MetricsPath)
	}
	if p.MetricsInterval < 0 || p.MetricsStaleness < 0 {
		return fmt.Errorf("queued_least_latency: metrics_interval and metrics_staleness must be positive")
	}
	if err := checkMetricsTiming("queued_least_latency", p.MetricsInterval, p.MetricsStaleness); err != nil {
		return err
	}
	if err := p.config().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("queued_least_latency: %v", err)
	}
	return nil
}

// Provision implements caddy.Provisioner.
func (p *QueuedLeastLatency) Provision(ctx caddy.Context) error {
	if err := p.Validate(); err != nil {
		return err
	}
	name := poolName(p.Pool)
	measure := latencyMeasure(p.LatencyMeasure)
	if measure == "" {
		measure = measureAuto
	}
	cfg, every := p.config(), p.logInterval()
	fingerprint := fmt.Sprintf("%+v %v", cfg, every) // without the TLS config: a pointer, new in each load
	cfg.EngineMetrics.TLS = upstreamTLS(enclosingProxy(ctx))
	log := ctx.Logger()
	return p.provision(ctx, selectorSpec{
		attempt: p.attemptOptions,
		module:  "queued_least_latency", pool: name, measure: measure,
		fingerprint: fingerprint,
		build: func(key stateKey) (*policyState, error) {
			s := qll.New(cfg)
			s.SetWaitObserver(qllCollector.WaitObserver(name))
			lg := &qllStateLog{state: s, pool: name, log: newStateLog(log)}
			lg.every.Store(int64(every))
			run := func(ctx context.Context) {
				var wg sync.WaitGroup
				wg.Go(func() { s.Run(ctx) }) // the engine metrics
				lg.run(ctx)
				wg.Wait()
			}
			return newPolicyState(key, s, policyParts{settings: func() any { return s.Config() },
				health: func() stateHealth { return qllHealth(s) }, run: run, closer: s.Close, extra: lg}), nil
		},
		apply: func(st *policyState) {
			st.picker.(*qll.State).Configure(cfg)
			st.extra.(*qllStateLog).every.Store(int64(every))
			st.extra.(*qllStateLog).log.set(log)
		},
	})
}

// qllHealth is what the queue knows of each replica, and its depth.
func qllHealth(s *qll.State) stateHealth {
	snap := s.Snapshot()
	h := stateHealth{QueueDepth: snap.QueueDepth, Replicas: []backendHealth{}, Detail: latencyAndSlots}
	if !s.Config().NoEngineMetrics {
		h.Metrics = s.Engine()
	}
	for _, r := range snap.Replicas {
		h.Replicas = append(h.Replicas, backendHealth{Addr: r.Addr, EWMALatency: r.EWMASeconds,
			StreamEWMA: &r.StreamEWMASeconds, ConcurrencyLimit: &r.Limit, Tried: r.Tried,
			InFlight: r.InFlight, Parallelism: r.Parallelism, SlotsFrom: r.SlotsFrom, Down: r.Down, Dispatched: r.Dispatched,
			Failures: r.Failures, Draining: !r.Present})
	}
	return h
}

// qllStateLog writes one line per interval with the queue and each
// replica's state; the interval is a setting a reload may change.
type qllStateLog struct {
	state *qll.State
	pool  string
	log   *stateLog
	every atomic.Int64 // time.Duration; <= 0 disables
}

func (l *qllStateLog) run(ctx context.Context) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		every := time.Duration(l.every.Load())
		wait := every
		if every <= 0 {
			wait = time.Second // disabled: look again for a reload that enables it
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if every <= 0 {
			continue
		}
		snap := l.state.Snapshot()
		fields := []zap.Field{zap.String("pool", l.pool), zap.Int("queue_depth", snap.QueueDepth),
			zap.Duration("oldest_wait", snap.OldestWait), zap.Uint64("dispatched", snap.Counters.Dispatched),
			zap.Uint64("evicted", snap.Counters.Evicted), zap.Uint64("timed_out", snap.Counters.TimedOut),
			zap.Uint64("failures", snap.Counters.Failures)}
		for _, r := range snap.Replicas {
			fields = append(fields, zap.String(r.Addr, fmt.Sprintf("ewma=%.3fs in_flight=%d slots=%d(%s) down=%t", r.EWMASeconds, r.InFlight, r.Parallelism, r.SlotsFrom, r.Down)))
		}
		l.log.get().Info("queued_least_latency state", fields...)
	}
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens:
//
//	lb_policy queued_least_latency {
//	    pool               <name>
//	    latency_threshold  auto|<duration|seconds>
//	    ewma_alpha         <float>
//	    queue_max_size     <int>
//	    queue_timeout      <duration|seconds>
//	    state_log_interval <duration|seconds>
//	    max_concurrency    <int>
//	    parallelism        auto|<int>
//	    max_fails          <int>
//	    fail_duration      <duration|seconds>
//	    latency_measure    auto|last_byte|first_byte
//	    engine_metrics     on|off
//	    metrics_interval   <duration|seconds>
//	    metrics_staleness  <duration|seconds>
//	    metrics_path       <path>
//	}
//
// Durations also accept plain seconds ("3.0"), as the reference's
// CUSTOM_ROUTER_* variables are written, so `{$CUSTOM_ROUTER_LATENCY_THRESHOLD:3}`
// works as a value; `{$CUSTOM_ROUTER_LATENCY_THRESHOLD:auto}` keeps the
// adaptive default when the variable is unset.
func (p *QueuedLeastLatency) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseModule(d, "queued_least_latency", nil, p, func(opt string, vals []string) (bool, error) {
		auto := len(vals) == 1 && vals[0] == "auto"
		switch {
		case opt == "latency_threshold" && auto:
			p.LatencyThreshold = 0
		case opt == "parallelism" && auto:
			p.Parallelism = 0
		default:
			return false, nil
		}
		return true, nil
	})
}
