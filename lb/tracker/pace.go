package tracker

import (
	"math"
	"time"
)

// paceAlpha weighs each new sample of a replica's pace (an EWMA over
// about the last 20 requests).
const paceAlpha = 0.1

// observePace folds one successful request into r's pace: its time to
// last byte per unit of cost (cost 0 counts as 1). Called under r.lmu,
// which orders the updates; readers load the bits without a lock.
func (r *replica) observePace(total time.Duration, cost int64) {
	x := total.Seconds() / float64(max(cost, 1))
	old := math.Float64frombits(r.pace.Load())
	if old > 0 {
		x = paceAlpha*x + (1-paceAlpha)*old
	}
	r.pace.Store(math.Float64bits(x))
}
