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
	// minMarginalGain: one more request in flight must add at least this
	// much throughput, in requests served alone per solo service time,
	// for the replica to count as having room. A replica's throughput at
	// k in flight is k / slowdown(k) (Little's law over the solo
	// latency): a one-at-a-time replica stays at 1 however many it holds
	// (a second request adds nothing), a batching engine keeps adding
	// (every request of its batch slows, yet the batch serves more), and
	// a batching engine whose batch is full adds nothing again (what it
	// cannot fit waits inside it). Per-request slowdown alone cannot tell
	// the last two apart: a real engine slows each request 1.5-3x at a
	// batch size where its throughput is still growing fast.
	minMarginalGain = 0.25
	// kneeFraction: a full replica's limit goes back to the lowest
	// concurrency seen serving this fraction of what it serves at the
	// concurrency found full.
	kneeFraction = 0.9
	// Weight of a new solo latency in its running estimate.
	soloAlpha = 0.2
	// Weight of a new slowdown in its level's running estimate.
	levelAlpha = 0.3
	// Probes above a limit that keep failing are made exponentially
	// rarer, down to one growth step per about 2^maxProbeBackoff samples.
	maxProbeBackoff = 8
	// maxLimit bounds the learned limit (the prediction divides by it).
	maxLimit = 1024
	// noticeableDelay: this much delay over the replica's solo latency
	// is not counted as a slowdown. Up to it the difference is the
	// machine's own jitter (scheduling, loopback, garbage collection):
	// counted, a replica that answers in a fraction of it read as full at
	// 2 in flight, and every other request waited at the edge, which
	// costs more than the replica's whole answer. Against a generation
	// or an image of a tenth of a second and more it changes nothing.
	noticeableDelay = 0.002 // seconds
	// minBusySamples: requests sent beside others that must be seen
	// before their mean may void the solo baseline (see observe): one
	// small request is no evidence.
	minBusySamples = 5
	// inflatedBaseline: a solo baseline this many times the mean latency
	// of requests sent beside others is void (see observe). Not less: a
	// first solo sample of a request twice the usual size is common, and
	// voiding the baseline costs a drain to one request in flight.
	inflatedBaseline = 4
)

// concurrencyLimit learns how many requests one replica serves at once
// while its throughput still grows — its useful concurrency: 1 for a
// diffusion server, up to what its batch (KV cache, max_num_seqs) holds
// for an LLM server. A request's latency is compared with the latency of
// the same replica serving alone, which gives the slowdown at the
// concurrency it was sent at and, by Little's law, the replica's
// throughput there (k / slowdown). The limit grows while one more request
// adds at least minMarginalGain of throughput, measured between the
// concurrency of the sample and a lower level seen before:
//   - the baseline is learned from requests that really ran alone (sent
//     when nothing else was in flight), per latency kind, instead of a
//     windowed minimum (a minimum is the smallest request, so every larger
//     one would read as queueing);
//   - slowdowns are kept per concurrency level (EWMA), so the throughput
//     curve is compared at two points, not read from one request;
//   - a full replica sets the limit towards the level where the
//     throughput still grew;
//   - a probe above a limit that fails again and again is backed off
//     exponentially, so a one-at-a-time replica is probed rarely: a probe
//     costs the probing request one extra service time.
//
// It starts at 1 in slow start, which doubles the limit whenever a first
// byte comes while more than half the limit's requests are answering at
// once (their responses begun, not ended: a batching engine answers its
// first tokens while the others run; a one-at-a-time server answers one
// at a time, however many it holds, so it stops at 2), and ends at the
// first full sample. Slow start on first bytes matters for engines whose
// requests take seconds: doubling per completed request kept a real
// engine at a small batch for tens of seconds while the rest waited at
// the edge. More than half, not all: doubling only on a request sent at
// the limit held each arrival over it at the edge for a first token's
// time whenever the load came near the limit (an engine streaming 11 at
// once stayed at 16 slots).
type concurrencyLimit struct {
	limit   float64 // >= 1; floor(limit) requests at once are "free slots"
	growing bool    // slow start
	// Per kind, over requests that ran alone: EWMAs of the timed latency
	// and of the whole duration (the same for plain responses).
	solo, soloTotal [kinds]float64
	soloN           [kinds]int
	// Per kind, over requests sent beside others (k >= 2): EWMAs of the
	// timed latency and of the whole duration (see observe).
	busy, busyTotal [kinds]float64
	busyN           [kinds]int
	// level[k] is the EWMA of the slowdown of requests sent at k in
	// flight (0: none seen); grown on demand up to maxLimit+1.
	level []float64
	// failedAt is the lowest concurrency a full sample was last seen at,
	// and failures how often in a row; a request served with room at or
	// above failedAt clears both.
	failedAt, failures int
}

func newConcurrencyLimit() concurrencyLimit {
	return concurrencyLimit{limit: 1, growing: true}
}

// slots is the number of requests the replica takes before it counts as
// busy.
func (c *concurrencyLimit) slots() int { return int(c.limit) }

// firstByte learns from a response that began while `answering` of the
// replica's responses (itself included) had begun and not ended: in slow
// start, more than half the limit doubles it. cap (> 0) bounds the limit.
// It reports whether it grew the limit.
func (c *concurrencyLimit) firstByte(answering, cap int) bool {
	if c.growing && 2*answering > c.slots() && (c.failedAt == 0 || 2*c.slots() < c.failedAt) {
		from := c.limit
		c.grow(2*c.limit, cap)
		return c.limit > from
	}
	return false
}

// ungrow takes back a doubling that firstByte made from `from`, for a
// response that turned out a refusal (4xx), not service. Only in slow
// start: there the limit has only grown since (every cut ends slow
// start), so it is at least twice from, or capped above from, and a half
// (not below from) undoes that doubling alone; after a cut there is
// nothing of it left to undo.
func (c *concurrencyLimit) ungrow(from float64) {
	if c.growing {
		c.limit = math.Max(from, c.limit/2)
	}
}

func (c *concurrencyLimit) grow(to float64, cap int) {
	c.limit = math.Min(to, maxLimit)
	if cap > 0 && c.limit > float64(cap) {
		c.limit = float64(cap)
	}
}

// observe learns from one successful request of the given kind, sent when
// k requests (itself included) were in flight on the replica, whose timed
// latency (first byte of a stream, last byte otherwise) and whole duration
// (0: unknown) are in seconds. cap (> 0) bounds the limit. room: the
// replica's own metrics say it has room (engineView.saysRoom), so no
// sample reads as full.
func (c *concurrencyLimit) observe(kind, k int, latency, total float64, cap int, room bool) {
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
	if k >= 2 && latency > 0 {
		if c.busyN[kind] == 0 {
			c.busy[kind], c.busyTotal[kind] = latency, total
		} else {
			c.busy[kind] = soloAlpha*latency + (1-soloAlpha)*c.busy[kind]
			c.busyTotal[kind] = soloAlpha*total + (1-soloAlpha)*c.busyTotal[kind]
		}
		c.busyN[kind]++
		// A request beside others is served no faster than alone, on
		// average: a baseline several times what such requests take is
		// a cold start (a first request that compiled or loaded) or an
		// outlier. Kept, a one-at-a-time server whose first request took
		// 20× its service read every request up to 20 in flight as
		// unslowed and was sent 20 at once for good: under load no
		// request ran alone again to correct it. (Plus the machine's
		// jitter: a replica answering in microseconds is not voided by
		// one stall of its own.)
		if c.soloN[kind] > 0 && c.busyN[kind] >= minBusySamples && inflatedBaseline*(c.busy[kind]+noticeableDelay) < c.solo[kind] {
			c.rebase(kind)
			return
		}
	}
	base, whole := c.solo[kind], c.soloTotal[kind]
	if !(base > 0) || !(whole > 0) || !(latency > 0) || k < 1 || k > maxLimit {
		return // no baseline for this kind yet: nothing to compare with
	}
	// The delay over the solo latency, in whole solo requests: for plain
	// responses latency/base. At least 1: a request faster than the
	// baseline is not a sign of more room than none at all.
	slowdown := 1.0
	if delay := latency - base - noticeableDelay; delay > 0 {
		// At most k: a replica holding k requests delays one by at most
		// the k-1 before it, if it serves them one at a time. A longer
		// delay is a stall (of the replica or of the machine), not a
		// sign of how many the replica serves at once; unbounded, one
		// stall of a replica that answers in microseconds read as a
		// thousandfold slowdown and kept its level full for many samples.
		slowdown = math.Min(1+delay/whole, float64(k))
	}
	s := c.record(k, slowdown)
	at := c.slots()
	full := false
	if k >= 2 && !room {
		j, sj := c.reference(k)
		full = (float64(k)/s-float64(j)/sj)/float64(k-j) < minMarginalGain
	}
	switch {
	case full:
		// Full: what it holds beyond some level waits inside it. Back
		// towards the lowest level that served about as much.
		c.full(k, float64(c.knee(k, float64(k)/s)))
	case k >= at:
		// Used up to its limit with room: allow one more.
		if c.failedAt > 0 && (k >= c.failedAt || room) {
			// What failed before works now, or the replica's own metrics
			// say it has room: no backed-off probing (one more per
			// request served at the limit grows the limit by half again
			// per service time).
			c.failedAt, c.failures = 0, 0
		}
		switch {
		case c.growing:
			c.grow(2*c.limit, cap)
		case c.failedAt == 0 || k+1 < c.failedAt:
			c.grow(c.limit+1, cap) // back up to where it last worked, fast
		default: // probing where it failed: +1 per round, backed off
			c.grow(c.limit+1/(c.limit*float64(int(1)<<min(c.failures, maxProbeBackoff))), cap)
		}
	}
}

// rebase starts the limit over from one slot, for a baseline of the
// given kind found far above what requests beside others take: the
// baseline and what was learned against it are void. The limit stays at
// one (no slow start on first bytes) until the next request of the kind
// that runs alone sets a new baseline; the requests sent before teach
// nothing (they have no baseline to be compared with). A batching engine
// too (its first request prefilled a cold prompt): keeping its slots, in
// slow start, until a request ran alone was tried and read worse, since
// with no baseline nothing cuts a limit that grew too far (calibrated
// four-replica sim at 9 req/s behind custom_router, 24 reps each: TTFT
// p90 1.21× round robin's kept, 1.08× drained; medians per rep).
func (c *concurrencyLimit) rebase(kind int) {
	c.solo[kind], c.soloTotal[kind], c.soloN[kind] = 0, 0, 0
	c.busyN[kind] = 0
	c.limit, c.growing = 1, false
	c.level = c.level[:0]
	c.failedAt, c.failures = 0, 0
}

// refused learns from a request the replica refused as overloaded (429)
// when k requests (itself included) were in flight: it holds fewer than
// k, so the limit goes back as after a full sample, below k.
func (c *concurrencyLimit) refused(k int) {
	k = max(k, 1)
	c.full(k, float64(k-1))
}

// full moves the limit towards target (at least one slot down from k:
// one noisy sample does not undo many good ones, and a failed probe at k
// always ends below k), ends slow start and records where it was full.
func (c *concurrencyLimit) full(k int, target float64) {
	if target < c.limit {
		c.limit = math.Max(1, math.Min(c.limit-(c.limit-target)/2, float64(k)-0.5))
	}
	c.growing = false
	if k == c.failedAt {
		c.failures++
	} else if c.failedAt == 0 || k < c.failedAt {
		c.failedAt, c.failures = k, 1
	}
}

// record folds a slowdown seen at k into level k's EWMA and returns it.
func (c *concurrencyLimit) record(k int, slowdown float64) float64 {
	if k >= len(c.level) {
		c.level = append(c.level, make([]float64, k+1-len(c.level))...)
	}
	if c.level[k] == 0 {
		c.level[k] = slowdown
	} else {
		c.level[k] = levelAlpha*slowdown + (1-levelAlpha)*c.level[k]
	}
	return c.level[k]
}

// knee is the lowest level below k whose throughput reached
// kneeFraction of x (the throughput at k), or k-1 when none did: the
// concurrency beyond which the replica served no more.
func (c *concurrencyLimit) knee(k int, x float64) int {
	if x*kneeFraction <= 1 {
		return 1
	}
	for j := 2; j < k && j < len(c.level); j++ {
		if c.level[j] > 0 && float64(j)/c.level[j] >= kneeFraction*x {
			return j
		}
	}
	return k - 1
}

// reference is the level the throughput at k is compared with and its
// slowdown: the highest level seen at or below k - k/4 (a gap, so that
// the noise of two nearby levels does not swamp their difference), or 1,
// whose slowdown is 1 by definition.
func (c *concurrencyLimit) reference(k int) (int, float64) {
	for j := k - max(1, k/4); j > 1; j-- {
		if j < len(c.level) && c.level[j] > 0 {
			return j, c.level[j]
		}
	}
	return 1, 1
}
