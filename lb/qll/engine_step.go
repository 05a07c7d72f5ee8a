package qll

import "time"

// stepsToFull is how many of a batching engine's steps requests must
// wait in it, admitted by none, before it counts as full (at least
// fullAfter): a request waits for the step after the one running when
// it arrived (two, with async scheduling).
const stepsToFull = 3

// maxStep bounds a step read from the samples: running counts that
// change seconds apart are a quiet engine, not a slow step.
const maxStep = time.Second

// stepClock reads a batching engine's step from its samples: an engine
// changes its running count only between steps (it admits and ends
// sequences there), so the time between two samples that each saw it
// change, with every sample between them close together (at most
// fullGap apart), is one step or a few. The shortest of the last few
// such intervals is the step (plus a sample's spacing at most).
//
// Why: a fixed fullAfter assumes steps of tens to a hundred
// milliseconds. Four engines sharing one GPU take 300-600 ms a step;
// their arrivals waited longer than fullAfter for the step that
// admitted them, and each such engine was taken for full at a fifth of
// its KV cache.
type stepClock struct {
	changedAt time.Time        // the last sample that saw a change, with only close samples since (zero: none)
	last      [4]time.Duration // the last intervals read, newest at next-1
	next      int
}

// note folds in a sample taken at at: changed says whether its running
// count differs from the last sample's; dense, whether the last sample
// was at most fullGap before it.
func (c *stepClock) note(at time.Time, changed, dense bool) {
	switch {
	case !dense:
		c.changedAt = time.Time{}
		return
	case !changed:
		return
	}
	if !c.changedAt.IsZero() {
		c.last[c.next] = at.Sub(c.changedAt)
		c.next = (c.next + 1) % len(c.last)
	}
	c.changedAt = at
}

// estimate is the step read so far, at most maxStep; 0 when none was.
func (c stepClock) estimate() time.Duration {
	step := time.Duration(0)
	for _, d := range c.last {
		if d > 0 && (step == 0 || d < step) {
			step = d
		}
	}
	return min(step, maxStep)
}
