package redisleast

import (
	"sync/atomic"
	"time"
)

// scriptBuckets are the upper bounds (seconds) of the script latency
// histogram: loopback calls take tens of microseconds, a remote HA Redis
// about a millisecond, and ReadTimeout cuts the tail.
var scriptBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// Stats is a snapshot of one Store's counters (monotonic since New) and
// state.
type Stats struct {
	Selections uint64 // leases handed out, Redis or fallback
	Releases   uint64 // leases released (first Release only)
	Fallbacks  uint64 // selections made locally because Redis was unavailable
	// Mismatches: selections made locally because none of the candidates
	// was a member in Redis, Redis reachable: another instance synced a
	// backend set that shares no replica with this one's (see Store.Pick).
	Mismatches uint64
	ViewPicks  uint64 // selections made from the view beyond call_rate (Redis reachable; see batcher)
	Shed       uint64 // ErrSaturated answers
	Errors     uint64 // failed Redis calls (transport errors and timeouts)
	Reclaimed  uint64 // requests of dead instances this instance's reaper reclaimed
	Pending    int    // releases waiting for Redis to come back
	Breaker    BreakerState
	// Script latency histogram: BucketCounts[i] counts calls that took at
	// most Buckets[i] seconds (cumulative, Prometheus style).
	Buckets      []float64
	BucketCounts []uint64
	ScriptCount  uint64
	ScriptSum    float64 // seconds
	// InFlight is the last known global count per member replica: from the
	// last Counts call or Sync (the Redis view), nil before either.
	InFlight map[string]int64

	// Queueing mode (all zero otherwise).
	Queueing      bool
	Queued        int64  // requests waiting in the global queue (all instances), as last read by the background loop
	Waiting       int    // this instance's requests waiting now
	QueuedTotal   uint64 // requests of this instance that had to wait
	Handovers     uint64 // of those, handed a slot by the queue
	QueueTimeouts uint64 // ErrQueueTimeout answers
	QueueCancels  uint64 // waiters whose client gave up
	// Queue wait histogram (handed-over requests), like the script's.
	WaitBuckets      []float64
	WaitBucketCounts []uint64
	WaitCount        uint64
	WaitSum          float64 // seconds
}

// waitBuckets are the upper bounds (seconds) of the queue wait histogram.
var waitBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// histo is a fixed-bucket histogram (at most 15 bounds).
type histo struct {
	bounds      []float64
	n           [16]atomic.Uint64 // the one after the last bound is +Inf
	count, nano atomic.Uint64
}

func (h *histo) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(h.bounds) && s > h.bounds[i] {
		i++
	}
	h.n[i].Add(1)
	h.count.Add(1)
	h.nano.Add(uint64(d.Nanoseconds()))
}

// snapshot returns the cumulative bucket counts.
func (h *histo) snapshot() (cum []uint64, count uint64, sum float64) {
	cum = make([]uint64, len(h.bounds))
	var run uint64
	for i := range h.bounds {
		run += h.n[i].Load()
		cum[i] = run
	}
	return cum, h.count.Load(), time.Duration(h.nano.Load()).Seconds()
}

type counters struct {
	selections, releases, fallbacks, shed, errors, reclaimed, viewPicks, mismatches atomic.Uint64
	hist                                                                            [14]atomic.Uint64 // len(scriptBuckets)+1: the last is +Inf
	histCount, histSumNanos                                                         atomic.Uint64
}

func (c *counters) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(scriptBuckets) && s > scriptBuckets[i] {
		i++
	}
	c.hist[i].Add(1)
	c.histCount.Add(1)
	c.histSumNanos.Add(uint64(d.Nanoseconds()))
}

// histogram returns the cumulative bucket counts.
func (c *counters) histogram() (cum []uint64, count uint64, sum float64) {
	cum = make([]uint64, len(scriptBuckets))
	var run uint64
	for i := range scriptBuckets {
		run += c.hist[i].Load()
		cum[i] = run
	}
	return cum, c.histCount.Load(), time.Duration(c.histSumNanos.Load()).Seconds()
}
