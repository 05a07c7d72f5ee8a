package qll

import (
	"time"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// kvFullUsage: a KV cache this full counts as full even with nothing
// waiting (the engine preempts before it queues; the simulator's
// one-at-a-time replicas report 1 while busy).
const kvFullUsage = 0.98

// fullAfter is how long requests must be waiting in an engine, in every
// sample, before it counts as full: a few steps of a batching engine
// (vLLM's take tens of milliseconds, transformers' 120 ms and more).
const fullAfter = 300 * time.Millisecond

// fullGap is the longest gap between two samples that still sees
// requests waiting all along: a sample after a longer one starts the
// run again (so full needs three samples at least; asked again while
// requests wait, a replica gives one every MinRefresh).
const fullGap = fullAfter / 2

// fullBuffer is how many of Sluice's requests a full engine of running
// requests may hold waiting in its own queue: one for every 8 running, at
// least one. The engine admits the next request the step a sequence
// ends; one held at the edge instead arrives a round trip and a step
// later, and an engine kept with an empty queue runs a smaller batch
// (the calibrated engine served 4% less and its TTFT p50 was 1.09×
// direct's at 8 req/s when the slots were cut to what it ran).
func fullBuffer(running int) int { return max(1, running/8) }

// engineView is what a replica's own metrics (vLLM, SGLang, TGI, Triton:
// requests waiting and running, KV-cache usage; see lb/modelmetrics) said
// at the last scrape, and the slots Sluice gives it from them.
//
// Why: a continuous-batching engine slows every request of its batch as
// the batch grows while its throughput keeps growing far beyond that
// point, so no latency-based limit can tell "slower" from "full" (the
// learned limit settled on a small batch and the rest waited at the edge:
// 15× the TTFT of no router at all on a real engine). The engine itself
// knows: a request it cannot run waits in its own queue. So where a
// replica exports that queue, a request is held at the edge only when
// the engine says it is full (requests waiting, or its KV cache full),
// and the learned limit decides only where it does not.
//
// The slots follow the samples the way TCP's window follows acks:
//   - until the engine has shown it runs two requests at once, it is
//     probed one request above Sluice's while it holds all of them, at
//     most one waiting (a one-at-a-time server answers that probe by
//     queueing it for fullAfter, and is then left to the learned limit
//     until a sample shows two running, which no one-at-a-time server
//     does; one whose KV cache has room for the probe is waiting for a
//     step, see probeFits);
//   - a batching engine with room (no more waiting than a full engine
//     may hold, or running more than in the last sample: admitting)
//     gets twice what it ran (or what Sluice had on it) until it is
//     first seen full, then a quarter more per sample with room (twice
//     again once it runs half as much again as it was full at: that was
//     no bound) — slots never shrink on an idle sample;
//   - a full engine (KV cache full, or more requests waiting than it may
//     hold, waitingAllowed, in every sample for fullAfter or three of
//     its steps, 1 s each until one is read, the samples at most
//     fullGap apart) keeps what it runs of Sluice's requests and a few
//     more waiting in its own queue (fullBuffer), refilled as the engine
//     admits them: nothing more is sent until one ends.
//
// While requests wait at the edge, and whenever a replica's slots are all
// taken, the state asks the scraper for fresh samples (at most every
// MinRefresh), so a burst grows the slots in scrape round trips, not in
// first tokens, and a probe is answered in one.
type engineView struct {
	until            time.Time // the sample is trusted until then (zero: no usable sample)
	waiting, running int
	runMax           int       // the most running in a sample since queuedSince
	fullAt           int       // running in the last sample that said full (batching)
	queuedSince      time.Time // first of the unbroken run of samples with requests waiting (zero: none)
	lastAt           time.Time // the last usable sample's time
	full             bool      // the last sample said full
	batching         bool      // some sample showed 2+ running
	single           bool      // some sample showed it full while running at most one
	sawFull          bool      // some sample since it was seen batching said full
	slots            int       // what a batching engine gets while samples are fresh
	ours             int       // Sluice's requests in flight on it at the last sample
	steps            stepClock // its step, read from the samples
}

// observe folds a sample in, taken while ours of Sluice's requests were in
// flight on the replica; staleness is how long a sample is trusted.
//
// Full is a KV cache at kvFullUsage, or more requests waiting than the
// engine may hold (waitingAllowed) in every sample for fullAfter, or
// stepsToFull of its steps where they are longer (stepClock): a
// step-based engine counts a request as waiting from its arrival to the
// step that admits it (a step or two later, with async scheduling), so
// requests waiting in a sample, or in two samples closer than a step,
// say nothing about room (on the calibrated engine, cutting
// the slots on every such sample held requests at the edge and tripled
// the TTFT p90; with two samples in a row, 50 ms apart, a burst of 24
// onto an engine with room for 64 still lost one to the edge). Nor do
// samples far apart: a sample more than fullGap after the last starts
// the run again (scraped once a second, a busy engine with room caught a
// request waiting for its step in two samples in a row often enough to
// be held at what it ran while its peers took its share and queued), and
// the state asks again for a replica whose sample shows requests waiting.
// Nor does an engine that admits while they wait: running more than in
// any sample since they began to wait starts the run again (a batch
// growing under a ramp, or its first steps slowed by cold prefixes, each
// arrival waiting for its step; taken for full, one calibrated engine of
// four was cut to the 8 it ran and grew a quarter per scrape, a second
// apart, while its peers took its share up to their KV bound). A full
// engine runs no more than it did, one ending as another starts; and one
// that climbs back to what it was last full at is at its bound again,
// not admitting (the mixed fleet's 8-sequence engines, so read, took a
// burst into their queues for 300 ms more: TTFT p99 0.31 s against
// 0.21 s).
func (e *engineView) observe(smp modelmetrics.Sample, ours int, staleness time.Duration) {
	if smp.Err != nil || smp.At.IsZero() || !smp.Have.Waiting || !smp.Have.Running {
		// A failed scrape, or a server that does not say what waits:
		// nothing to go on, the learned limit decides.
		e.until, e.queuedSince, e.lastAt = time.Time{}, time.Time{}, time.Time{}
		return
	}
	e.until = smp.At.Add(staleness)
	ran := e.running
	e.waiting, e.running = int(smp.Waiting), int(smp.Running)
	e.steps.note(smp.At, e.running != ran, !e.lastAt.IsZero() && smp.At.Sub(e.lastAt) <= fullGap)
	// Room to grow into: no more waiting than a full engine may hold
	// (each waits for its step), or more running than in the last
	// sample (admitting them) and than it ran when last full.
	fewWaiting := e.waiting <= e.waitingAllowed()
	room := fewWaiting || (e.running > ran && e.running > e.fullAt)
	switch {
	case fewWaiting:
		e.queuedSince = time.Time{}
	case e.queuedSince.IsZero() || smp.At.Sub(e.lastAt) > fullGap || (e.running > e.runMax && e.running > e.fullAt):
		e.queuedSince, e.runMax = smp.At, e.running
	}
	e.lastAt = smp.At
	waited := !e.queuedSince.IsZero() && smp.At.Sub(e.queuedSince) >= e.waitForFull()
	if !e.batching && probeFits(smp) {
		waited = false // its probe waits for a step, not for the one it runs to end
	}
	e.full = waited || (smp.Have.KVCache && smp.KVCacheUsage >= kvFullUsage)
	e.ours = ours
	if e.sawFull && e.running >= e.fullAt+max(2, e.fullAt/2) {
		// Half as much again as when it was full: that was no bound (a
		// long step read as full), it grows as one never seen full.
		e.sawFull = false
	}
	base := max(e.running, ours)
	if e.running >= 2 && !e.batching {
		// Two running at once: it batches, whatever an earlier sample
		// made it look like. A batching engine's first steps can queue
		// the probe for fullAfter (a long prefill, steps slowed by
		// engines sharing its GPU) exactly as a one-at-a-time server
		// does; left to the learned limit for good, it took twice its
		// peers' requests while they were held at what they ran.
		e.batching, e.single = true, false
	}
	switch {
	case e.full && !e.batching:
		if e.running <= 1 {
			e.single = true
		}
	case e.full:
		e.sawFull, e.fullAt = true, e.running
		// What it runs of ours and the buffer, not capped at ours: each
		// moment the edge had nothing to send would otherwise ratchet a
		// KV-full engine down to what it runs, its queue empty.
		// At most maxLimit, as in growth: a page may say 2^53 running,
		// and its eighth as a buffer let a full engine take everything.
		e.slots = min(maxLimit, max(1, min(ours, e.running)+fullBuffer(e.running)))
	case e.single || !room:
		// one-at-a-time, or requests waiting behind what it runs: no change
	case e.running >= 2 || e.batching:
		e.batching = true
		grown := 2 * base
		if e.sawFull {
			grown = base + max(1, base/4)
		}
		e.slots = min(maxLimit, max(e.slots, grown, 2))
	}
}

// Where a replica's slots come from (ReplicaSnapshot.SlotsFrom).
const (
	slotsPinned      = "pinned"       // Parallelism, or 1 under LatencyThreshold
	slotsLearned     = "learned"      // the learned limit (concurrencyLimit)
	slotsEngine      = "engine"       // a batching engine's own metrics
	slotsEngineProbe = "engine_probe" // room, not yet known to batch: one above what it runs
)

// slotsAt is the replica's slots at now given the learned limit's, and
// where they come from: the engine's while its samples are fresh and it
// batches (at least the learned limit's while it has room); one above
// Sluice's requests on it while it holds them all, at most one waiting,
// and has not shown yet whether it batches; the learned limit's
// otherwise.
func (e *engineView) slotsAt(now time.Time, learned int) (int, string) {
	switch {
	case e.until.IsZero() || now.After(e.until) || e.single || (e.full && !e.batching):
		return learned, slotsLearned
	case e.batching && e.full:
		return max(1, e.slots), slotsEngine
	case e.batching && !e.sawFull:
		// Room: the learned limit's slow start may run ahead of the
		// samples (a burst's first tokens come before its next sample
		// without requests waiting in a step-based engine).
		return max(learned, e.slots), slotsEngine
	case e.batching:
		// Room again after it was full: the engine's own figure, which
		// grows a quarter per sample with room. The learned limit, grown
		// by the first bytes of a long ramp, is not a measure of this
		// engine's room: taken here, one sample without a request waiting
		// let a KV-full engine take the whole edge queue at once (56 in
		// flight where it ran 22; four engines on one GPU, TTFT p99 4×
		// round robin's).
		return max(1, e.slots), slotsEngine
	case e.ours == 0 || e.waiting > 1 || e.running+e.waiting < e.ours:
		// Nothing to probe from: none of ours on it, ours not all in the
		// engine (in transit, or a one-at-a-time server caught between
		// two of them), or two waiting behind what it runs (a
		// one-at-a-time server's queue). One waiting is the probe's own
		// picture on a step-based engine (waiting until the step that
		// admits it): held at the edge until a sample showed two running,
		// the calibrated engine's first requests at R = 4 waited a scrape
		// and then went two to one replica (TTFT p99 0.64 s, round robin
		// 0.56 s). A one-at-a-time server so takes at most two behind the
		// one it runs before it is known.
		return learned, slotsLearned
	}
	return max(learned, e.ours+1), slotsEngineProbe
}

// probeFits reports whether smp shows a paged KV cache with room for
// another request as large as what it holds: an engine not yet known to
// batch whose probe waits beside one running request then waits for a
// step (a long cold prefill, steps slowed by engines sharing its GPU),
// not for the one it runs to end, and is not taken for one-at-a-time.
// Servers that run one at a time export no KV cache (diffusion, TGI's
// queue gauges) or report it full while busy (the harness's); both are
// still told by their probe's wait. (Taken for one-at-a-time, four
// calibrated engines sharing one GPU, KV usage 0.14, were held at the
// learned limit, one or two requests each, from 1.5 s in while round
// robin sent them three or four; so told, Sluice sent their first 17
// requests where round robin did, at the same TTFTs.)
func probeFits(smp modelmetrics.Sample) bool {
	return smp.Have.KVCache && smp.KVCacheUsage < kvFullUsage/2
}

// waitForFull is how long requests must wait in the engine, in every
// sample, before it counts as full: fullAfter, or stepsToFull of a
// batching engine's steps where they are longer, maxStep each until its
// step is read (a one-at-a-time server is told by its probe's wait,
// which its service time sets, not a step).
func (e *engineView) waitForFull() time.Duration {
	if !e.batching {
		return fullAfter
	}
	step := e.steps.estimate()
	if step == 0 {
		// Not read yet (its samples came far apart, or its running count
		// has not changed twice): the longest step believed. Given
		// fullAfter, engines on a shared GPU whose steps take 400-700 ms
		// were taken for full at 2-4 running and KV usage 0.3-0.4 in
		// their first seconds and held there, while a peer whose step
		// was read took a burst: 14 in flight against 6-9, its TTFT 3×
		// theirs.
		step = maxStep
	}
	return max(fullAfter, stepsToFull*step)
}

// waitingAllowed is how many requests may wait in the engine's own queue,
// however long, without its counting as full: none until it is known to
// batch (a one-at-a-time server shows itself by queueing one), then the
// few a full engine is let hold (fullBuffer). A batching engine whose
// prefills outrun its step's token budget keeps one or two waiting, each
// admitted a step or two later. Taken for full, the calibrated engines
// at R = 4 (16 req/s, real time) were cut to what they ran one after
// another at KV usage 0.75-0.94, 12% of the picks skipped the replica
// whose turn it was (round robin: 1%), and TTFT was 1.1% above round
// robin's; allowed, 4% and level with it.
func (e *engineView) waitingAllowed() int {
	if !e.batching {
		return 0
	}
	return fullBuffer(e.running)
}

// saysRoom reports whether the replica's fresh sample says it has room:
// nothing waits in it, its KV cache is not full, and it is not known to
// serve one at a time. Then the learned limit takes no sample for full
// (see concurrencyLimit.observe): latency says how busy the machine is,
// the engine's queue whether the replica is. When the machine the proxy
// and the replicas run on slows every request alike (other processes, a
// starved CPU), each latency read against a solo baseline from before
// looked like a replica past its knee: four instant simulated replicas
// that reported empty queues were cut to 3-7 slots each, and 36% of the
// requests were evicted from the edge queue with 503s while round robin
// served 85% of them. A one-at-a-time server still shows itself: its
// second request waits in it. Only for an engine not seen batching: a
// batching engine's slots are its own figure (slotsAt), and a learned
// limit kept from every cut grew past it before the engine was first
// full (four engines sharing a simulated GPU: qll's TTFT p90 went from
// +10% to +24% of round robin's behind custom_router).
func (e *engineView) saysRoom(now time.Time) bool {
	return !e.until.IsZero() && !now.After(e.until) && !e.single && !e.batching && !e.full && e.waiting == 0
}

// wantsSample reports whether a fresh sample could give r more slots:
// it exports its queue and is not known to serve one at a time.
func (e *engineView) wantsSample() bool { return !e.until.IsZero() && !e.single }
