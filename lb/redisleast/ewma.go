package redisleast

import (
	"math"
	"sync/atomic"
	"time"
)

// ewma is an exponentially weighted moving average of durations, safe
// for concurrent use without a lock.
type ewma struct{ bits atomic.Uint64 } // float64 nanoseconds; 0 = no sample yet

const ewmaWeight = 0.1

func (e *ewma) observe(d time.Duration) {
	x := float64(max(d, 1))
	for {
		old := e.bits.Load()
		v := x
		if old != 0 {
			prev := math.Float64frombits(old)
			v = prev + ewmaWeight*(x-prev)
		}
		if e.bits.CompareAndSwap(old, math.Float64bits(v)) {
			return
		}
	}
}

func (e *ewma) get() time.Duration {
	return time.Duration(math.Float64frombits(e.bits.Load()))
}
