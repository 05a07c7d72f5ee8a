package flow

// ConcurrencyDetector is the seed's concurrency-detector: open-loop, from
// the controller's own in-flight accounting. Capacity is MaxConcurrency
// requests (or MaxTokenConcurrency tokens, in tokens mode) per replica, so
//
//	saturation = in-flight / (per-replica limit × replicas)
//
// and the gate closes when in-flight reaches the pool's aggregate limit.
// It reacts at once to dispatches and releases but cannot see the replicas'
// real memory pressure; it also counts only what this controller
// dispatched, so with several Sluice instances each needs its share of
// the capacity.
type ConcurrencyDetector struct {
	perReplica float64
	tokens     bool
	limit      float64 // per-replica limit with headroom, for filters
	replicas   func() int
}

// NewConcurrencyDetector builds the detector from cfg (defaults applied).
// replicas returns the current number of replicas; nil means the limits
// are for the whole pool (one "replica"). With no replica the pool has no
// capacity and is saturated.
func NewConcurrencyDetector(cfg DetectorConfig, replicas func() int) *ConcurrencyDetector {
	cfg = Config{Detector: cfg}.WithDefaults().Detector
	d := &ConcurrencyDetector{perReplica: float64(cfg.MaxConcurrency), replicas: replicas}
	if cfg.ConcurrencyMode == ModeTokens {
		d.tokens, d.perReplica = true, float64(cfg.MaxTokenConcurrency)
	}
	d.limit = d.perReplica * (1 + cfg.Headroom)
	return d
}

// Saturation implements SaturationDetector. The capacity it answers is
// max_concurrency × replicas in requests mode; unknown (0) in tokens
// mode, where it depends on the requests' sizes.
func (d *ConcurrencyDetector) Saturation(in InFlight) Verdict {
	n := 1
	if d.replicas != nil {
		n = d.replicas()
	}
	if n <= 0 {
		return Verdict{Load: 1}
	}
	if d.tokens {
		return Verdict{Load: float64(in.Tokens) / (d.perReplica * float64(n))}
	}
	return Verdict{Load: float64(in.Requests) / (d.perReplica * float64(n)), Capacity: poolLimit(d.perReplica, n)}
}

// poolLimit is perReplica × n (n ≥ 0), at most maxPoolLimit. The
// product is taken in float64 and bounded before the conversion: limits
// and replicas come from the config, and int64(perReplica) × n of huge
// ones wrapped to a negative or small count (a global gate then granted
// nothing; band queues were sized from it).
func poolLimit(perReplica float64, n int) int64 {
	return int64(min(perReplica*float64(n), maxPoolLimit))
}

// ReplicaLimit is the most one replica should hold, in requests or tokens:
// the per-replica limit × (1 + headroom). As in the seed, headroom lets a
// per-replica filter burst above the target for affinity; it does not move
// the pool gate.
func (d *ConcurrencyDetector) ReplicaLimit() float64 { return d.limit }

// PoolLimit is the pool's aggregate limit in the detector's unit:
// max_concurrency × replicas requests, or max_token_concurrency ×
// replicas tokens when tokens is true. A global gate shares it out.
func (d *ConcurrencyDetector) PoolLimit() (limit int64, tokens bool) {
	n := 1
	if d.replicas != nil {
		n = d.replicas()
	}
	return poolLimit(d.perReplica, max(n, 0)), d.tokens
}

// maxPoolLimit bounds the pool's limit: past float64's (and Lua's, in
// flow/redisgate) exact integers a count of requests or tokens is no count.
const maxPoolLimit = 1 << 53
