package qll

import "math"

// Latency kinds: a streamed response is timed to its first byte (queue +
// prefill), a plain one to its last byte. The two are not comparable (a
// stream's first byte comes 5× sooner than a completion's last), so every
// estimate is kept per kind and a sample is only ever compared with its
// own kind.
const (
	plainKind = iota
	streamKind
	kinds
)

// Tuning of the adaptive limit. These are properties of the signal, not of
// the workload: they hold for one-at-a-time and batching replicas alike.
const (
	// A request slowed by more than this factor, against the same replica
	// serving the same kind of request alone, waited inside the replica:
	// the concurrency it was sent at is beyond what the replica serves at
	// once. A one-at-a-time replica slows a second request by 1–2× (it
	// waits for the rest of the first); a batching one by a few percent
	// per extra request. The delay is measured against a whole request's
	// duration (see observe), so for a stream, whose first byte is what is
	// timed, a first token 100 ms later in a batch is a small slowdown and
	// a first token that waited for a whole generation a large one.
	slowdownTolerance = 1.3
	// Weight of a new solo latency in its running estimate.
	soloAlpha = 0.2
	// Probes above a limit that keep failing are made exponentially
	// rarer, down to one growth step per about 2^maxProbeBackoff samples.
	maxProbeBackoff = 8
	// maxLimit bounds the learned limit (the prediction divides by it).
	maxLimit = 1024
)

// concurrencyLimit learns how many requests one replica serves at once
// without slowing them down — its useful concurrency: 1 for a diffusion
// server, about the batch size for an LLM server. It is Vegas-like
// (Netflix concurrency-limits, Envoy's adaptive concurrency): a request's
// latency is compared with the latency of the same replica serving
// alone, and the limit grows while that ratio stays within
// slowdownTolerance. Three differences make it fit inference:
//   - the baseline is learned from requests that really ran alone (sent
//     when nothing else was in flight), per latency kind, instead of a
//     windowed minimum (a minimum is the smallest request, so every larger
//     one would read as queueing);
//   - a slowdown sets the limit to the concurrency the replica showed
//     (k / slowdown), not a fixed fraction;
//   - a probe above a limit that fails again and again is backed off
//     exponentially, so a one-at-a-time replica is probed rarely: a probe
//     costs the probing request one extra service time.
//
// It starts at 1 in slow start (doubling per unslowed request sent at the
// limit: a batching replica is found within a few requests, which matters
// when each takes seconds), which ends at the first slowdown.
type concurrencyLimit struct {
	limit   float64 // >= 1; floor(limit) requests at once are "free slots"
	growing bool    // slow start
	// Per kind, over requests that ran alone: EWMAs of the timed latency
	// and of the whole duration (the same for plain responses).
	solo, soloTotal [kinds]float64
	soloN           [kinds]int
	// failedAt is the lowest concurrency a slowdown was last seen at, and
	// failures how often in a row; a request served unslowed at or above
	// failedAt clears both.
	failedAt, failures int
}

func newConcurrencyLimit() concurrencyLimit {
	return concurrencyLimit{limit: 1, growing: true}
}

// slots is the number of requests the replica takes before it counts as
// busy.
func (c *concurrencyLimit) slots() int { return int(c.limit) }

// observe learns from one successful request of the given kind, sent when
// k requests (itself included) were in flight on the replica, whose timed
// latency (first byte of a stream, last byte otherwise) and whole duration
// (0: unknown) are in seconds. cap (> 0) bounds the limit.
func (c *concurrencyLimit) observe(kind, k int, latency, total float64, cap int) {
	if !(total >= latency) {
		total = latency
	}
	if k <= 1 {
		// Alone on the replica: the baseline for its kind.
		if c.soloN[kind] == 0 {
			c.solo[kind], c.soloTotal[kind] = latency, total
		} else {
			c.solo[kind] = soloAlpha*latency + (1-soloAlpha)*c.solo[kind]
			c.soloTotal[kind] = soloAlpha*total + (1-soloAlpha)*c.soloTotal[kind]
		}
		c.soloN[kind]++
	}
	base, whole := c.solo[kind], c.soloTotal[kind]
	if !(base > 0) || !(whole > 0) || !(latency > 0) {
		return // no baseline for this kind yet: nothing to compare with
	}
	// The delay over the solo latency, in whole solo requests: for plain
	// responses latency/base.
	slowdown := 1 + (latency-base)/whole
	at := c.slots()
	switch {
	case k >= 2 && slowdown > slowdownTolerance:
		// Waited inside the replica: it serves about k/slowdown at once.
		served := math.Max(1, float64(k)/slowdown)
		if served < c.limit {
			// Halfway to what was shown, at least one slot down from k:
			// one noisy sample does not undo many good ones, and a failed
			// probe at k always ends below k.
			c.limit = math.Max(1, math.Min(c.limit-(c.limit-served)/2, float64(k)-0.5))
		}
		c.growing = false
		if k == c.failedAt {
			c.failures++
		} else if c.failedAt == 0 || k < c.failedAt {
			c.failedAt, c.failures = k, 1
		}
	case k >= at:
		// Used up to its limit and not slowed: allow one more.
		if c.failedAt > 0 && k >= c.failedAt {
			c.failedAt, c.failures = 0, 0 // what failed before works now
		}
		switch {
		case c.growing:
			c.limit *= 2
		case c.failedAt == 0 || k+1 < c.failedAt:
			c.limit++ // back up to where it last worked, fast
		default: // probing where it failed: +1 per round, backed off
			c.limit += 1 / (c.limit * float64(int(1)<<min(c.failures, maxProbeBackoff)))
		}
		if cap > 0 && c.limit > float64(cap) {
			c.limit = float64(cap)
		}
		c.limit = math.Min(c.limit, maxLimit)
	}
}
