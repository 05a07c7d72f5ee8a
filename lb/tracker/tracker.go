// Package tracker keeps, per pool, the two facts every non-queueing policy
// needs about its replicas: the exact number of requests in flight (Caddy's
// own count is incremented only after Select returns, so concurrent picks
// would see stale numbers) and passive health (consecutive failures mark a
// replica down for a while).
package tracker

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// Config sets passive health. Zero values take the defaults.
type Config struct {
	// MaxFails consecutive failures mark a replica down (default 1) for
	// FailDuration (default 5s), doubling on each further failure up to 16×.
	MaxFails     int
	FailDuration time.Duration
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.MaxFails == 0 {
		c.MaxFails = 1
	}
	if c.FailDuration == 0 {
		c.FailDuration = 5 * time.Second
	}
	return c
}

// Tracker holds one pool's replicas. Reads on the pick path take a read
// lock and atomic loads only.
type Tracker struct {
	mu   sync.RWMutex
	cfg  Config
	reps map[string]*replica // present replicas and removed ones still draining
	// retired holds removed replicas, still draining, whose address was
	// added back meanwhile: reps has a fresh replica for it, and these
	// are forgotten once their last request is released.
	retired map[*replica]struct{}
	now     func() time.Time
	// acquired numbers the acquisitions, so that each replica's latest
	// one tells which replica got a request longest ago.
	acquired atomic.Uint64
}

type replica struct {
	addr string
	// present: in the set. Written under the tracker's write lock; read
	// without it by Release, which takes that lock only for a replica
	// that left the set (to forget it once idle), not on every request
	// that brings a count back to 0.
	present  atomic.Bool
	inFlight atomic.Int64
	// lastAcquired is the tracker's acquisition number of the replica's
	// latest request (0: none yet).
	lastAcquired atomic.Uint64
	// inFlightCost sums the in-flight leases' costs (estimated tokens).
	inFlightCost atomic.Int64
	// pace: float64 bits of the EWMA of time to last byte per cost unit
	// (pace.go); 0 until a success reports one.
	pace atomic.Uint64
	// health, guarded by hmu: rarely written (on failures and recoveries)
	hmu         sync.Mutex
	consecFails int
	lastFail    time.Time    // when the last of consecFails happened
	downUntil   atomic.Int64 // unix nanoseconds; 0 = up
	failures    atomic.Uint64
	// in-flight leases, oldest first (acquired in time order, appended at
	// the tail), so the ones older than a timeout are found from the head
	// without scanning the rest.
	lmu        sync.Mutex
	head, tail *Lease
}

// New returns an empty tracker.
func New(cfg Config) *Tracker {
	return &Tracker{cfg: cfg.WithDefaults(), reps: map[string]*replica{}, retired: map[*replica]struct{}{}, now: time.Now}
}

// Configure swaps the health settings, keeping the counts.
func (t *Tracker) Configure(cfg Config) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.cfg
	t.cfg = cfg.WithDefaults()
	if t.cfg == old {
		return
	}
	// A replica failures marked down is judged again by the new
	// settings, from its last failure: a reload that raises max_fails
	// or shortens fail_duration must not leave it out on the old ones.
	rejudge := func(r *replica) {
		r.hmu.Lock()
		if r.consecFails > 0 {
			r.downUntil.Store(t.cfg.downUntil(r.consecFails, r.lastFail))
		}
		r.hmu.Unlock()
	}
	for _, r := range t.reps {
		rejudge(r)
	}
	for r := range t.retired {
		rejudge(r)
	}
}

// downUntil is when a replica with n consecutive failures, the last at
// last, is up again (unix nanoseconds; 0: up).
func (c Config) downUntil(n int, last time.Time) int64 {
	if n < c.MaxFails {
		return 0
	}
	factor := int64(1) << min(n-c.MaxFails, 4)
	from, d := last.UnixNano(), int64(c.FailDuration)
	if d > 0 && (d > math.MaxInt64/factor || from > math.MaxInt64-factor*d) {
		// A fail_duration of years would wrap into the past: the
		// replica would come back up on its fifth failure.
		return math.MaxInt64
	}
	return from + factor*d
}

// SetReplicas makes addrs the present set (duplicates count once);
// removed replicas are forgotten once their last request is released.
// A replica that stays present keeps its counts and health. One added
// back while requests from before its removal are still in flight is a
// fresh replica, as one added back after they ended is: up, and its
// counts its own requests' only. The old requests stay counted on the
// removed replica (PerReplica and Snapshot still show them, as a
// draining entry) until each is released, and their outcomes say
// nothing of the replica added back: a stuck old request is not taken
// for its one probe, and old requests failing (the replica restarted,
// say) do not mark it down.
func (t *Tracker) SetReplicas(addrs []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keep := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		if keep[a] {
			continue
		}
		keep[a] = true
		r, ok := t.reps[a]
		if ok && r.present.Load() {
			continue
		}
		if ok && r.inFlight.Load() > 0 {
			// Draining: it drains on as retired (acquire only counts a
			// present replica, under the read lock, so its count only
			// falls from now on).
			t.retired[r] = struct{}{}
		}
		fresh := &replica{addr: a}
		fresh.present.Store(true)
		t.reps[a] = fresh
	}
	for a, r := range t.reps {
		if keep[a] {
			continue
		}
		r.present.Store(false) // before the count is read: see Release
		if r.inFlight.Load() == 0 {
			delete(t.reps, a)
		}
	}
}

// Load returns addr's in-flight count and whether it may get a request:
// present and not down, or down-time over and idle (one probe at a time).
func (t *Tracker) Load(addr string) (inFlight int, usable bool) {
	t.mu.RLock()
	r, ok := t.reps[addr]
	ok = ok && r.present.Load() // present is written under the write lock
	t.mu.RUnlock()
	if !ok {
		return 0, false
	}
	n := int(r.inFlight.Load())
	return n, !t.downNow(r, n)
}

// downNow: r may not take a request now, with n in flight: failures
// marked it down and its down time is not over, or is over and a probe
// (one of the n) is in flight.
func (t *Tracker) downNow(r *replica, n int) bool {
	until := r.downUntil.Load()
	return until != 0 && (t.now().UnixNano() < until || n > 0)
}

// Down reports whether addr is a replica that failures marked down and
// that may not take a request now: its down time is not over, or it is
// over and a probe is in flight. Unknown addresses are not down (unlike
// Load, for callers that pick among addresses the tracker may not know).
func (t *Tracker) Down(addr string) bool {
	t.mu.RLock()
	r, ok := t.reps[addr]
	t.mu.RUnlock()
	if !ok {
		return false
	}
	return t.downNow(r, int(r.inFlight.Load()))
}

// maxCost bounds one lease's cost, so that a replica's sum of in-flight
// costs cannot overflow (it would wrap negative and show a loaded replica
// as idle): 2^23 leases of it fit in an int64. Real estimates are far
// below it.
const maxCost = 1 << 40

// Lease is one attempt on a replica; Release it exactly once (later calls
// are no-ops and return false).
type Lease struct {
	t          *Tracker
	r          *replica
	released   atomic.Bool
	start      time.Time
	cost       int64
	prev, next *Lease
	Addr       string
}

// Acquire counts a request in flight to addr. It returns nil if addr is
// not a replica of the pool (removed meanwhile).
func (t *Tracker) Acquire(addr string) *Lease { return t.AcquireCost(addr, 0) }

// AcquireCost is Acquire for a request of the given cost (a policy's
// estimate of its work, e.g. tokens), summed per replica until released
// (negative counts as 0, and above 2^40 as 2^40).
func (t *Tracker) AcquireCost(addr string, cost int64) *Lease {
	return t.acquire(addr, cost, false)
}

// AcquireUsable is AcquireCost for a replica that Load says may get a
// request, checked and counted at once: nil also if failures have it down
// now, or its down time is over and another request, the one probe, got
// there first. (Load then AcquireCost lets every pick that read Load
// between the two send a probe.)
func (t *Tracker) AcquireUsable(addr string, cost int64) *Lease {
	return t.acquire(addr, cost, true)
}

func (t *Tracker) acquire(addr string, cost int64, usable bool) *Lease {
	cost = min(max(cost, 0), maxCost)
	t.mu.RLock()
	r, ok := t.reps[addr]
	ok = ok && r.present.Load()
	if ok {
		// Under the read lock: SetReplicas cannot forget r now.
		if usable && r.downUntil.Load() != 0 {
			// Down: only as the one request in flight (0 → 1, or another
			// got there first), and only once its time is over, read
			// after the count: a failed probe stores its new down time
			// before it leaves the count, so the time read now is the
			// one of the probe whose slot this takes.
			ok = r.inFlight.CompareAndSwap(0, 1)
			if ok && t.now().UnixNano() < r.downUntil.Load() {
				r.inFlight.Add(-1) // still down; r is present, nothing to forget
				ok = false
			}
		} else {
			r.inFlight.Add(1)
		}
	}
	if ok {
		r.inFlightCost.Add(cost)
		r.lastAcquired.Store(t.acquired.Add(1))
	}
	t.mu.RUnlock()
	if !ok {
		return nil
	}
	l := &Lease{t: t, r: r, Addr: addr, cost: cost}
	r.lmu.Lock()
	// Read under lmu, so that the list is in start order (View stops at
	// the first lease after its cutoff).
	l.start = t.now()
	if r.tail == nil {
		r.head, r.tail = l, l
	} else {
		l.prev, r.tail.next, r.tail = r.tail, l, l
	}
	r.lmu.Unlock()
	return l
}

// Release ends the attempt and applies its outcome to passive health.
func (l *Lease) Release(o lb.Outcome) bool {
	if !l.released.CompareAndSwap(false, true) {
		return false
	}
	t, r := l.t, l.r
	r.lmu.Lock()
	if l.prev != nil {
		l.prev.next = l.next
	} else {
		r.head = l.next
	}
	if l.next != nil {
		l.next.prev = l.prev
	} else {
		r.tail = l.prev
	}
	l.prev, l.next = nil, nil
	r.inFlightCost.Add(-l.cost)
	if o.Kind == lb.Success && o.Total > 0 {
		r.observePace(o.Total, l.cost)
	}
	r.lmu.Unlock()
	switch o.Kind {
	case lb.Success:
		r.hmu.Lock()
		r.consecFails = 0
		r.downUntil.Store(0)
		r.hmu.Unlock()
	case lb.Failure:
		r.failures.Add(1)
		t.mu.RLock() // held: a Configure meanwhile would judge it by the old settings
		r.hmu.Lock()
		r.consecFails++
		r.lastFail = t.now()
		if until := t.cfg.downUntil(r.consecFails, r.lastFail); until != 0 {
			r.downUntil.Store(until)
		}
		r.hmu.Unlock()
		t.mu.RUnlock()
	}
	// A replica that left the set is forgotten once idle. SetReplicas
	// marks it gone and then reads its count; this drops the count and
	// then reads the mark: one of the two sees both, so it is forgotten.
	if r.inFlight.Add(-1) == 0 && !r.present.Load() {
		t.mu.Lock()
		if !r.present.Load() && r.inFlight.Load() == 0 {
			if t.reps[r.addr] == r {
				delete(t.reps, r.addr)
			} else {
				delete(t.retired, r) // its address was added back
			}
		}
		t.mu.Unlock()
	}
	return true
}

// ReplicaStats is one replica's view, for health output and metrics.
type ReplicaStats struct {
	Addr     string
	InFlight int
	Down     bool
	Failures uint64
	Present  bool
}

// Snapshot lists every replica, present ones and draining ones. An
// address added back while its old requests drain is listed twice: the
// present replica, and the draining one (Present false) with the old
// requests.
func (t *Tracker) Snapshot() []ReplicaStats {
	t.mu.RLock()
	defer t.mu.RUnlock()
	now := t.now().UnixNano()
	out := make([]ReplicaStats, 0, len(t.reps)+len(t.retired))
	stats := func(r *replica) ReplicaStats {
		return ReplicaStats{Addr: r.addr, InFlight: int(r.inFlight.Load()),
			Down: now < r.downUntil.Load(), Failures: r.failures.Load(), Present: r.present.Load()}
	}
	for _, r := range t.reps {
		out = append(out, stats(r))
	}
	for r := range t.retired {
		out = append(out, stats(r))
	}
	return out
}

// InFlight is the total over all replicas: zero once every lease is released.
func (t *Tracker) InFlight() int {
	n := 0
	for _, s := range t.Snapshot() {
		n += s.InFlight
	}
	return n
}
