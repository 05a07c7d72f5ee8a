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
}

type counters struct {
	selections, releases, fallbacks, shed, errors, reclaimed atomic.Uint64
	hist                                                     [14]atomic.Uint64 // len(scriptBuckets)+1: the last is +Inf
	histCount, histSumNanos                                  atomic.Uint64
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
