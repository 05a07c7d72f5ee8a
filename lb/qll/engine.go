package qll

import (
	"time"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// kvFullUsage: a KV cache this full counts as full even with nothing
// waiting (the engine preempts before it queues; the simulator's
// one-at-a-time replicas report 1 while busy).
const kvFullUsage = 0.98

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
//   - until the engine has shown it runs two requests at once with
//     nothing waiting, it is probed one request above Sluice's while it
//     runs all of them
//     (a one-at-a-time server answers that probe by queueing it, two
//     samples in a row, and is then left to the learned limit for good);
//   - a batching engine with room gets twice what it ran (or what Sluice
//     had on it) until it is first seen full, then a quarter more per
//     sample with room — slots never shrink on an idle sample;
//   - a full engine (KV cache full, or requests waiting in two samples
//     in a row) keeps what it runs of Sluice's requests: nothing more is
//     sent until one ends.
//
// While requests wait at the edge the state asks the scraper for fresh
// samples (at most every MinRefresh), so a burst grows the slots in
// scrape round trips, not in first tokens.
type engineView struct {
	until            time.Time // the sample is trusted until then (zero: no usable sample)
	waiting, running int
	queued           bool // the sample before this one had requests waiting too
	full             bool // the last sample said full
	batching         bool // some sample showed 2+ running with nothing waiting
	single           bool // some sample showed it full while running at most one
	sawFull          bool // some sample since it was seen batching said full
	slots            int  // what a batching engine gets while samples are fresh
	ours             int  // Sluice's requests in flight on it at the last sample
}

// observe folds a sample in, taken while ours of Sluice's requests were in
// flight on the replica; staleness is how long a sample is trusted.
//
// Full is a KV cache at kvFullUsage, or requests waiting in two samples
// in a row: a step-based engine counts a request as waiting from its
// arrival to the next step, so one sample with a request or two waiting
// says nothing about room (on the calibrated engine, cutting the slots on
// every such sample held requests at the edge and tripled the TTFT p90).
func (e *engineView) observe(smp modelmetrics.Sample, ours int, staleness time.Duration) {
	if smp.Err != nil || smp.At.IsZero() || !smp.Have.Waiting || !smp.Have.Running {
		// A failed scrape, or a server that does not say what waits:
		// nothing to go on, the learned limit decides.
		e.until, e.queued = time.Time{}, false
		return
	}
	e.until = smp.At.Add(staleness)
	e.waiting, e.running = int(smp.Waiting), int(smp.Running)
	e.full = (e.waiting > 0 && e.queued) || (smp.Have.KVCache && smp.KVCacheUsage >= kvFullUsage)
	e.queued = e.waiting > 0
	e.ours = ours
	base := max(e.running, ours)
	switch {
	case e.full && !e.batching:
		if e.running <= 1 {
			e.single = true
		}
	case e.full:
		e.sawFull = true
		e.slots = max(1, min(ours, e.running))
	case e.single || e.waiting > 0:
		// one-at-a-time, or a request waiting for the next step: no change
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
// batches; one above Sluice's requests on it while it runs them all with
// room and has not shown yet whether it batches; the learned limit's
// otherwise.
func (e *engineView) slotsAt(now time.Time, learned int) (int, string) {
	switch {
	case e.until.IsZero() || now.After(e.until) || e.single || (e.full && !e.batching):
		return learned, slotsLearned
	case e.batching:
		return max(1, e.slots), slotsEngine
	case e.waiting > 0 || e.ours == 0 || e.running < e.ours:
		// Nothing to probe from: a request waiting for the next step,
		// none of ours on it, or ours not all running (in transit, or
		// a one-at-a-time server caught between two of them).
		return learned, slotsLearned
	}
	return max(learned, e.ours+1), slotsEngineProbe
}

// wantsSample reports whether a fresh sample could give r more slots:
// it exports its queue and is not known to serve one at a time.
func (e *engineView) wantsSample() bool { return !e.until.IsZero() && !e.single }
