package caddymodule

import (
	"context"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/flow/redisgate"
	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

func init() { registerCollectors(flowCollector, flowGateCollector) }

// Collectors of every live flow_control state: its controller, and with
// redis its gate.
var (
	flowCollector     = flow.NewCollector(flowControllers)
	flowGateCollector = redisgate.NewCollector(flowGates)
)

// flowState is one pool's controller, its detector inputs and a metrics
// scraper (the utilization detector's: with the concurrency detector it
// scrapes nothing, see scrapes).
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
	gate *redisgate.Gate
	life lifecycle
	name string
	// requests counts the requests in the handler (queued or admitted):
	// what the state must serve before it is destroyed (state_drain.go).
	requests requestGauge
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
	st.life.begin(name, func(set []lb.Backend, managed bool) {
		st.updateView(func(v *replicaView) { v.managed, v.set = managed, set })
	}, st.scraper.Run)
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
	st.pointScraperLocked()
	c := st.c
	st.mu.Unlock()
	if c != nil {
		c.Kick()
	}
}

// scrapes reports whether cfg's detector reads the replicas' metrics.
// The concurrency detector does not: its pool's replicas are not scraped
// (load on every replica, every interval, for a reading nothing used).
func scrapes(cfg flow.Config) bool { return cfg.Detector.Type == flow.DetectorUtilization }

// pointScraperLocked points the scraper at the view's replicas if the
// detector reads their metrics, else at none (st.mu held).
func (st *flowState) pointScraperLocked() {
	targets := map[string]string{}
	if cfg := st.cfg.Load(); cfg != nil && scrapes(*cfg) {
		for _, b := range st.view.Load().backends() {
			targets[b.Dial] = b.URL
		}
	}
	st.scraper.SetTargets(targets)
}

// Settings implements observable.
func (st *flowState) Settings() any {
	s := map[string]any{"Config": st.config(), "MetricsInterval": st.scraper.Config().Interval,
		"Replicas": st.view.Load().replicas()}
	if st.gate != nil {
		gc := st.gate.Config()
		s["Redis"], s["LeaseTTL"], s["FallbackShare"], s["Global"] = gc.Conn.Redacted(), gc.LeaseTTL, gc.FallbackShare, st.gate.Stats()
	}
	return s
}

// Health implements observable: flow control shows its settings (with
// redis, its share of the pool among them) and no replica view of its own;
// its queues are in the metrics. With the utilization detector the
// replicas' scraped metrics show, which hold or open the pool's gate.
func (st *flowState) Health() stateHealth {
	if scrapes(st.config()) {
		return stateHealth{Metrics: st.scraper}
	}
	return stateHealth{}
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

// repairLogger says that a claim found the pool's records in Redis corrupt
// or stray and repaired them (redisgate.Config.OnRepair): something other
// than Sluice wrote there, or Redis evicted or lost part of them.
func repairLogger(log *zap.Logger, pool string) func(int64, string) {
	return func(n int64, what string) {
		log.Warn("flow_control: repaired corrupt or stray records in the pool's Redis keys",
			zap.String("pool", pool), zap.Int64("repairs", n), zap.String("what", what))
	}
}

// flowGates maps each pool to the gate of its live shared flow control.
func flowGates() map[string]*redisgate.Gate {
	out := map[string]*redisgate.Gate{}
	for _, r := range sharedStates.visible() { // the preferred state of a pool first
		if _, seen := out[r.key.pool]; r.key.module != "flow_control" || seen {
			continue
		}
		if g := r.st.(*flowState).gate; g != nil {
			out[r.key.pool] = g
		}
	}
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
	st.pointScraperLocked() // a reload may switch the detector
	if st.c == nil {
		var opts []flow.Option
		if st.gate != nil {
			opts = append(opts, flow.PublishDemand(st.gate.Feed())) // what the gate claims from
		}
		c, err := flow.New(cfg, st.detector(cfg), opts...)
		if err != nil {
			return err
		}
		c.SetObserver(flowCollector.Observer(st.name))
		st.c = c
		return nil
	}
	return st.c.Reconfigure(cfg, st.detector(cfg))
}

// Destruct implements caddy.Destructor: once no config uses the state,
// it is destroyed when its requests have ended (state_drain.go); requests
// still queued after drainLimit get 503 shutdown.
func (st *flowState) Destruct() error {
	destroyWhenIdle(stateKey{module: "flow_control", pool: st.name}, st.requests.idle, func() {
		st.life.end()
		if c := st.ctl(); c != nil {
			c.Close()
		}
		if st.gate != nil {
			st.gate.Close()
		}
	})
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
