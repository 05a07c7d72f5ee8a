package qll

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// engineSays is a fresh sample of an engine that exports its queue.
func engineSays(waiting, running int, kv float64) modelmetrics.Sample {
	return modelmetrics.Sample{Waiting: float64(waiting), Running: float64(running), KVCacheUsage: kv,
		Have: modelmetrics.Have{Waiting: true, Running: true, KVCache: true}, At: time.Now()}
}

// later is the sample taken d after smp.
func later(smp modelmetrics.Sample, d time.Duration) modelmetrics.Sample {
	smp.At = smp.At.Add(d)
	return smp
}

func inFlight(s *State, addr string) int { return s.InFlight()[addr] }

// leases holds requests in flight on a state until the test ends.
type leases struct {
	t    *testing.T
	s    *State
	held []*Lease
}

// holding returns an empty holder whose requests are released when t ends.
func holding(t *testing.T, s *State) *leases {
	h := &leases{t: t, s: s}
	t.Cleanup(func() {
		for _, l := range h.held {
			l.Release(success(time.Millisecond))
		}
	})
	return h
}

// upTo acquires until n are held (each must be let through at once).
func (h *leases) upTo(n int) {
	h.t.Helper()
	for len(h.held) < n {
		h.held = append(h.held, mustAcquire(h.t, h.s))
	}
}

// batchingEngine is a state with one replica, "a", known to batch: seen
// running 2, then 8 with nothing waiting (16 slots); its step not read.
func batchingEngine() *State {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	seenBatching(s)
	return s
}

// seenBatching gives replica "a" of s the samples of batchingEngine.
func seenBatching(s *State) {
	s.engineSample("a", engineSays(0, 2, 0.1))
	s.engineSample("a", engineSays(0, 8, 0.3))
}

// steppedEngine is batchingEngine whose step was read as 50 ms a second
// before (running 1, 2, 3 in samples 50 ms apart).
func steppedEngine() *State {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	ago := time.Now().Add(-time.Second)
	for i := range 3 {
		smp := engineSays(0, 1+i, 0.1)
		smp.At = ago.Add(time.Duration(i) * 50 * time.Millisecond)
		s.engineSample("a", smp)
	}
	seenBatching(s)
	return s
}

// A batching engine with room takes every request: probed one above what
// it runs until it shows two running with nothing waiting, then twice
// what it runs per sample. The learned limit (1 while nothing has
// answered) holds nobody back.
func TestABatchingEngineWithRoomTakesEveryWaiter(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	s.engineSample("a", engineSays(0, 0, 0))
	first := mustAcquire(t, s)
	defer first.Release(success(time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 19
	out := enqueue(t, s, ctx, n)
	for running := 1; s.Snapshot().QueueDepth > 0; running = inFlight(s, "a") {
		if running > 40 {
			t.Fatalf("%d in flight and still %d waiting", running, s.Snapshot().QueueDepth)
		}
		s.engineSample("a", engineSays(0, running, 0.3))
	}
	for i := 0; i < n; i++ {
		if r := <-out; r.err != nil {
			t.Fatal(r.err)
		} else {
			defer r.lease.Release(success(time.Millisecond))
		}
	}
	if got := inFlight(s, "a"); got != n+1 {
		t.Fatalf("in flight %d, want %d", got, n+1)
	}
	if from := s.Snapshot().Replicas[0].SlotsFrom; from != slotsEngine {
		t.Fatalf("slots from %q, want %q", from, slotsEngine)
	}
}

// A server that queues its second request while it runs one serves one
// at a time: its probe is the last, the learned limit decides from then
// on, whatever later samples say.
func TestAnEngineThatQueuesBehindOneIsLeftToTheLearnedLimit(t *testing.T) {
	s, l1, l2 := probeQueuedBehindOne(t)
	if !s.replicas["a"].eng.single {
		t.Fatal("a server that queued one behind one for fullAfter is not marked one-at-a-time")
	}
	s.engineSample("a", engineSays(0, 1, 0.1))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if l, err := s.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a third request on a one-at-a-time server got %v, %v; want to wait", l, err)
	}
	if from := s.Snapshot().Replicas[0].SlotsFrom; from != slotsLearned {
		t.Fatalf("slots from %q, want %q", from, slotsLearned)
	}
	l1.Release(success(time.Millisecond))
	l2.Release(success(time.Millisecond))
}

// An engine whose KV cache has room for another request as large as the
// one it runs, and whose probe waits beside that one for fullAfter and
// more, is waiting for a step (a cold prefill, a GPU shared with other
// engines), not for the one it runs to end: it is probed, one above
// Sluice's requests on it, and the step that admits them shows it
// batches.
func TestAProbeWaitingBesideOneWithRoomInTheKVCacheWaitsForAStep(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	s.engineSample("a", engineSays(0, 0, 0))
	h := holding(t, s)
	h.upTo(1)
	s.engineSample("a", engineSays(0, 1, 0.13))
	h.upTo(2)
	queuedFor(s, "a", engineSays(1, 1, 0.13), 3*fullAfter)
	if e := s.replicas["a"].eng; e.single || e.full {
		t.Fatalf("a probe waiting %v beside one running at KV 0.13: single %v full %v, want neither", 3*fullAfter, e.single, e.full)
	}
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 3 || got.SlotsFrom != slotsEngineProbe {
		t.Fatalf("slots %d from %q, want 3 (one above the 2 of ours) from %q", got.Parallelism, got.SlotsFrom, slotsEngineProbe)
	}
	h.upTo(3)
	s.engineSample("a", engineSays(0, 3, 0.3)) // the step admitted them
	if e := s.replicas["a"].eng; !e.batching {
		t.Fatal("three running: not known to batch")
	}
}

// The simulator's one-at-a-time replicas say so with a full KV cache
// while they run one: never probed.
func TestAFullKVCacheAtOneRunningIsOneAtATime(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	l := mustAcquire(t, s)
	defer l.Release(success(time.Millisecond))
	s.engineSample("a", engineSays(0, 1, 1))
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 1 || got.SlotsFrom != slotsLearned {
		t.Fatalf("slots %d from %q, want 1 from the learned limit", got.Parallelism, got.SlotsFrom)
	}
}

// A batching engine that says it is full (requests waiting in it) keeps
// what it runs of ours and one more in its own queue (one per 8
// running): the rest wait at the edge, and each of ours that ends lets
// one through.
func TestAFullEngineKeepsWhatItRunsAndABuffer(t *testing.T) {
	s := steppedEngine()
	var leases []*Lease
	for i := 0; i < 11; i++ {
		leases = append(leases, mustAcquire(t, s))
	}
	queuedFor(s, "a", engineSays(3, 8, 0.9), fullAfter) // still: 8 of our 11 run; 9 slots
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := enqueue(t, s, ctx, 1)
	for i := 0; i < 2; i++ {
		leases[i].Release(success(time.Millisecond))
		select {
		case r := <-out:
			t.Fatalf("dispatched with %d of ours in flight on a full engine that runs 8 (9 slots): %+v", inFlight(s, "a"), r)
		default:
		}
	}
	leases[2].Release(success(time.Millisecond)) // 8 in flight: room under 9
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.lease.Release(success(time.Millisecond))
	for _, l := range leases[3:] {
		l.Release(success(time.Millisecond))
	}
}

// A full engine whose own queue has emptied gets its buffer back: it
// keeps what it runs of ours and fullBuffer more, whatever Sluice had on
// it at the sample. Capped at Sluice's count instead, each moment the
// edge had nothing to send ratcheted the slots down to what the engine
// ran, and a KV-full engine then got each next request only on a
// release, a step after it could have admitted it (four calibrated
// engines on one simulated GPU, saturated: 22-25 running where their KV
// caches held 26, with requests held at the edge; TTFT p50 +39% on round
// robin's).
func TestAFullEngineWhoseQueueEmptiedGetsItsBufferBack(t *testing.T) {
	s := batchingEngine() // 16 slots
	held := holding(t, s)
	held.upTo(16)
	s.engineSample("a", engineSays(0, 16, 0.99)) // KV full, its queue empty
	want := 16 + fullBuffer(16)
	if got := s.Snapshot().Replicas[0].Parallelism; got != want {
		t.Fatalf("full with its queue empty: %d slots, want the 16 it runs and %d waiting", got, fullBuffer(16))
	}
	held.upTo(want)                                    // the buffer, sent at once
	s.engineSample("a", engineSays(want-16, 16, 0.99)) // the buffer waits in its queue
	if got := s.Snapshot().Replicas[0].Parallelism; got != want {
		t.Fatalf("full with its buffer waiting: %d slots, want %d", got, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := enqueue(t, s, ctx, 1) // held at the edge
	select {
	case r := <-out:
		t.Fatalf("dispatched past a full engine's buffer (%d in flight): %+v", inFlight(s, "a"), r)
	default:
	}
}

// A batching engine with room grows its slots while a few requests wait
// for its next step, or while it admits them: it runs more than it did
// in the last sample. Growing only on samples with nothing waiting, an
// engine whose steps outlast its arrivals' gaps (four engines on one
// GPU: 300 ms steps, a request or two waiting in nearly every sample)
// held 6-14 requests at the edge at a fifth of its KV cache while round
// robin sent them in: TTFT p50 1.9 s against 1.1 s over those seconds.
// One that runs no more than it did while more wait than a full engine
// may hold is not grown: it may be at its bound.
func TestABatchingEngineAdmittingWhileRequestsWaitGrows(t *testing.T) {
	s := batchingEngine() // 16 slots
	held := holding(t, s)
	slots := func() int { return s.Snapshot().Replicas[0].Parallelism }
	held.upTo(16)
	s.engineSample("a", engineSays(fullBuffer(14), 14, 0.4)) // a few waiting for its step
	if got := slots(); got != 32 {
		t.Fatalf("%d waiting behind 14 running, 16 of ours: %d slots, want 32", fullBuffer(14), got)
	}
	held.upTo(32)
	s.engineSample("a", engineSays(8, 24, 0.6)) // admitting: 24 running where it ran 14
	if got := slots(); got != 64 {
		t.Fatalf("8 waiting behind 24 running, up from 14: %d slots, want 64", got)
	}
	s.engineSample("a", engineSays(8, 24, 0.6)) // no more running, 8 waiting
	if got := slots(); got != 64 {
		t.Fatalf("8 waiting behind the same 24 running: %d slots, want the 64 it had", got)
	}
	if s.replicas["a"].eng.full {
		t.Fatal("full after one sample of 8 waiting")
	}
}

// An engine taken for full that then runs half as much again as it did
// was not at its bound (a step longer than fullAfter, its arrivals
// waiting for it, read as full): it grows again as one never seen full,
// twice what it runs per sample with room, not a quarter more. Left to
// a quarter a sample, the four engines sharing one simulated GPU, each
// taken for full at 2-4 running in its first seconds, ramped slower
// than their arrivals and held them at the edge.
func TestAnEngineRunningHalfAgainWhatItWasFullAtGrowsAsNeverFull(t *testing.T) {
	s := steppedEngine() // 16 slots
	holding(t, s).upTo(8)
	queuedFor(s, "a", engineSays(4, 4, 0.3), fullAfter)
	if !s.replicas["a"].eng.full {
		t.Fatal("4 waiting behind 4 for fullAfter: not full")
	}
	s.engineSample("a", engineSays(0, 5, 0.3)) // room, a little more than at full
	if got := s.Snapshot().Replicas[0].Parallelism; got != 10 {
		t.Fatalf("room at 5 running, 8 of ours, after full at 4: %d slots, want 10 (8 and a quarter)", got)
	}
	s.engineSample("a", engineSays(0, 8, 0.4)) // twice what it was full at
	if got := s.Snapshot().Replicas[0].Parallelism; got != 16 {
		t.Fatalf("room at 8 running after full at 4: %d slots, want 16 (twice 8)", got)
	}
}

// Samples that cannot be trusted leave the learned limit in charge: a
// failed scrape, a server that does not export its queue, a sample older
// than the staleness, and every sample with engine_metrics off.
func TestUntrustedSamplesLeaveTheLearnedLimit(t *testing.T) {
	stale := engineSays(0, 4, 0.1)
	stale.At = time.Now().Add(-time.Hour)
	failed := engineSays(0, 4, 0.1)
	failed.Err = errors.New("connection refused")
	noQueue := engineSays(0, 4, 0.1)
	noQueue.Have.Waiting = false
	for name, c := range map[string]struct {
		cfg Config
		smp modelmetrics.Sample
	}{
		"stale": {Config{}, stale}, "failed": {Config{}, failed}, "no queue gauge": {Config{}, noQueue},
		"engine_metrics off": {Config{NoEngineMetrics: true}, engineSays(0, 4, 0.1)},
	} {
		t.Run(name, func(t *testing.T) {
			s := New(c.cfg)
			s.SetReplicas([]string{"a"})
			s.engineSample("a", engineSays(0, 2, 0.1))
			s.engineSample("a", c.smp)
			if got := s.Snapshot().Replicas[0]; got.Parallelism != 1 || got.SlotsFrom != slotsLearned {
				t.Fatalf("slots %d from %q, want 1 from the learned limit", got.Parallelism, got.SlotsFrom)
			}
		})
	}
}

// Requests waiting for less than fullAfter are the next steps': a
// step-based engine counts a request as waiting from its arrival to the
// step that admits it. Neither the slots of a batching engine nor a new
// engine's probe are cut for them, however many samples see them, and a
// one-at-a-time verdict needs them waiting for fullAfter.
func TestRequestsWaitingBrieflyAreNotFull(t *testing.T) {
	s := batchingEngine() // 16 slots
	waiting := engineSays(2, 8, 0.3)
	for _, d := range []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond, fullAfter - time.Millisecond} {
		s.engineSample("a", later(waiting, d))
	}
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 16 || got.SlotsFrom != slotsEngine {
		t.Fatalf("after samples with 2 waiting for less than %v: slots %d from %q, want 16 from the engine", fullAfter, got.Parallelism, got.SlotsFrom)
	}
	s.engineSample("a", later(engineSays(0, 8, 0.3), fullAfter))
	s.engineSample("a", later(waiting, fullAfter+time.Millisecond))
	s.engineSample("a", later(waiting, 2*fullAfter))
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 16 {
		t.Fatalf("waiting broken by a sample with none: slots %d, want 16", got.Parallelism)
	}

	n := New(Config{})
	n.SetReplicas([]string{"b"})
	l := mustAcquire(t, n)
	defer l.Release(success(time.Millisecond))
	first := engineSays(1, 1, 0.1)
	n.engineSample("b", first)
	n.engineSample("b", later(first, 50*time.Millisecond))
	n.engineSample("b", later(engineSays(0, 2, 0.1), 100*time.Millisecond))
	if got := n.Snapshot().Replicas[0]; got.SlotsFrom != slotsEngine {
		t.Fatalf("an engine that queued one request for a step, then ran two: slots from %q, want %q", got.SlotsFrom, slotsEngine)
	}
}

// The probe needs the engine to run every request Sluice has on it: a
// sample that shows fewer (one in transit, or a one-at-a-time server
// caught between two requests) probes nothing.
func TestNoProbeWhileOursAreNotAllRunning(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	l := mustAcquire(t, s)
	defer l.Release(success(time.Millisecond))
	s.engineSample("a", engineSays(0, 0, 0))
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 1 || got.SlotsFrom != slotsLearned {
		t.Fatalf("ours 1, engine running 0: slots %d from %q, want 1 from the learned limit", got.Parallelism, got.SlotsFrom)
	}
	s.engineSample("a", engineSays(0, 1, 0.1))
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 2 || got.SlotsFrom != slotsEngineProbe {
		t.Fatalf("ours 1, engine running 1: slots %d from %q, want 2 from the probe", got.Parallelism, got.SlotsFrom)
	}
}

// A new engine whose sample shows the probe waiting (a step-based engine
// counts a request as waiting until the step that admits it) is probed
// once more; two waiting behind what it runs end the probe. Held at the
// edge instead until a sample showed two running, the calibrated
// engine's first requests at R = 4 waited for a scrape and then went two
// to one replica: TTFT p99 0.64 s against round robin's 0.56 s.
func TestAProbeWaitingForItsStepIsProbedOnce(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	s.engineSample("a", engineSays(0, 0, 0))
	held := []*Lease{mustAcquire(t, s)}
	defer func() {
		for _, l := range held {
			l.Release(success(time.Millisecond))
		}
	}()
	s.engineSample("a", engineSays(0, 1, 0.1))
	held = append(held, mustAcquire(t, s)) // the probe
	s.engineSample("a", engineSays(1, 1, 0.1))
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 3 || got.SlotsFrom != slotsEngineProbe {
		t.Fatalf("one running, the probe waiting for its step: slots %d from %q, want 3 from the probe", got.Parallelism, got.SlotsFrom)
	}
	held = append(held, mustAcquire(t, s))
	s.engineSample("a", engineSays(2, 1, 0.1)) // two waiting behind one: a one-at-a-time server's picture
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 1 || got.SlotsFrom != slotsLearned {
		t.Fatalf("one running, two waiting: slots %d from %q, want 1 from the learned limit", got.Parallelism, got.SlotsFrom)
	}
}

// An engine that keeps admitting while requests wait in it is not full:
// its batch is growing under a ramp, each arrival waiting for the step
// that admits it. Requests waiting in every sample for fullAfter while
// the engine ran more than in any sample since they began to wait do not
// make it full; waiting while it runs no more (requests ending as others
// start), or no more than it ran when it was last full, does. Taken for full on a ramp, one calibrated
// engine of four was cut to the 8 it ran and grew a quarter per
// scrape, a second apart, while its peers took its share to their KV
// bound (R = 4: in-flight 15 against 29, TTFT p99 1.4 s).
func TestAnEngineAdmittingWhileRequestsWaitIsNotFull(t *testing.T) {
	s := batchingEngine() // 16 slots
	// feed gives a the samples smp(0..8), 50 ms apart from start.
	feed := func(start time.Time, smp func(i int) modelmetrics.Sample) {
		for i := 0; i <= 8; i++ {
			m := smp(i)
			m.At = start.Add(time.Duration(i) * 50 * time.Millisecond)
			s.engineSample("a", m)
		}
	}
	at := time.Now()
	// 400 ms of samples, one more running in each
	feed(at, func(i int) modelmetrics.Sample { return engineSays(2, 8+i, 0.3) })
	if e := s.replicas["a"].eng; e.full || e.sawFull {
		t.Fatalf("running 8 → 16 while 2 wait, for %v: full %v (seen full %v), want room", 8*50*time.Millisecond, e.full, e.sawFull)
	}
	if got := s.Snapshot().Replicas[0]; got.Parallelism < 16 {
		t.Fatalf("slots %d, want at least 16", got.Parallelism)
	}
	at = at.Add(time.Second)
	// as many running, give or take one: full
	feed(at, func(i int) modelmetrics.Sample { return engineSays(3, 16+i%2, 0.8) })
	if !s.replicas["a"].eng.full {
		t.Fatal("3 waiting for 400 ms while it ran 16-17: not full")
	}
	// Room again, then requests waiting while it climbs back to what it
	// was full at: a burst on an engine at its bound, full as before (the
	// mixed fleet's slow engines, 8 sequences each, took the burst's
	// requests into their queues for 300 ms more: TTFT p99 0.31 s against
	// 0.21 s).
	at = at.Add(time.Second)
	feed(at, func(i int) modelmetrics.Sample {
		if i == 0 {
			return engineSays(0, 14, 0.7)
		}
		return engineSays(3, min(13+i, 16), 0.8)
	})
	if !s.replicas["a"].eng.full {
		t.Fatal("3 waiting for 350 ms while it climbed back to the 16 it was last full at: not full")
	}
}

// A batching engine that keeps a request or two waiting, however long,
// is not full: its prefills outrun its step's token budget, and each is
// admitted a step or two later. Only more than a full engine may hold
// in its own queue (fullBuffer: one per 8 running) makes it full. Taken
// for full, the calibrated engines at R = 4 (16 req/s, real time) were
// cut to what they ran one after another at KV usage 0.75-0.94, and the
// arrivals each missed went to its peers: TTFT 1.1% above round robin's.
func TestABatchingEngineKeepingAFewWaitingIsNotFull(t *testing.T) {
	s := steppedEngine() // 16 slots
	at := time.Now()
	for _, c := range []struct {
		waiting, running int
		full             bool
	}{{1, 15, false}, {2, 16, false}, {2, 15, true}, {3, 16, true}} {
		at = at.Add(2 * time.Second) // a run of its own
		smp := engineSays(c.waiting, c.running, 0.77)
		smp.At = at
		queuedFor(s, "a", smp, 2*fullAfter)
		e := s.replicas["a"].eng
		if e.full != c.full {
			t.Errorf("%d waiting behind %d running for %v, samples %v apart: full %v, want %v",
				c.waiting, c.running, 2*fullAfter, fullGap, e.full, c.full)
		}
		if !c.full && s.Snapshot().Replicas[0].Parallelism < 16 {
			t.Errorf("%d waiting behind %d running: slots %d, want at least 16", c.waiting, c.running, s.Snapshot().Replicas[0].Parallelism)
		}
	}
}

// queuedFor feeds the samples a replica with requests waiting gives when
// it is asked again while they wait (see fullGap): smp, then smp again
// every fullGap until d after it.
// probeQueuedBehindOne is one replica "a" running one of ours whose
// probe (the second) its engine kept waiting for fullAfter.
func probeQueuedBehindOne(t *testing.T) (s *State, first, probe *Lease) {
	t.Helper()
	s = New(Config{})
	s.SetReplicas([]string{"a"})
	s.engineSample("a", engineSays(0, 0, 0))
	first = mustAcquire(t, s)
	s.engineSample("a", queueOnly(engineSays(0, 1, 0)))
	probe = mustAcquire(t, s)
	queuedFor(s, "a", queueOnly(engineSays(1, 1, 0)), fullAfter) // still waiting: not the next step's
	return s, first, probe
}

// queueOnly is smp from a server that exports its queue but no KV cache
// (TGI's gauges, a diffusion server's).
func queueOnly(smp modelmetrics.Sample) modelmetrics.Sample {
	smp.KVCacheUsage, smp.Have.KVCache = 0, false
	return smp
}

func queuedFor(s *State, addr string, smp modelmetrics.Sample, d time.Duration) {
	for at := time.Duration(0); at <= d; at += fullGap {
		s.engineSample(addr, later(smp, at))
	}
}

// Two samples far apart that each catch a request waiting for the next
// step do not show requests waiting for fullAfter: the queue may have
// emptied in between, many times. Scraped once a second, a busy engine
// with room often has one arrival waiting for its step in two samples
// in a row; counted as full, it was held at the edge at what it ran
// while its peers took its share, went past their KV caches and queued
// (the calibrated engine at R = 4, 16 req/s: 15 running against 33 on
// another, TTFT p99 1.3 s against round robin's 0.53 s).
func TestWaitingInSamplesFarApartIsNotFull(t *testing.T) {
	s := steppedEngine()               // 16 slots
	waiting := engineSays(2, 15, 0.77) // beyond the one a full engine of 15 may hold
	s.engineSample("a", later(waiting, time.Second))
	s.engineSample("a", later(waiting, 2*time.Second))
	s.engineSample("a", later(waiting, 3*time.Second))
	if got := s.Snapshot().Replicas[0]; got.SlotsFrom != slotsEngine || got.Parallelism < 16 {
		t.Fatalf("two waiting in samples a second apart: slots %d from %q, want at least 16 from the engine", got.Parallelism, got.SlotsFrom)
	}
	// Asked again while they wait, it shows them waiting all along: full.
	queuedFor(s, "a", later(waiting, 4*time.Second), fullAfter)
	if got := s.Snapshot().Replicas[0]; !s.replicas["a"].eng.full || got.Parallelism != 1 {
		t.Fatalf("waiting in samples %v apart for %v: full %v, slots %d; want full, 1 (none of ours on it)", fullGap, fullAfter, s.replicas["a"].eng.full, got.Parallelism)
	}
}

// An engine whose step is not read yet (its samples far apart, or its
// running count changed once) is given the longest step believed
// (maxStep) before requests waiting in it make it full. Given fullAfter,
// four engines sharing one GPU, their steps 400-700 ms, were taken for
// full at 2-4 running in their first seconds and held there while a peer
// whose step was read took a burst: 14 in flight against 6-9, its TTFT
// three times theirs.
func TestAnEngineWhoseStepIsUnknownGetsTheLongestStepBeforeFull(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	s.engineSample("a", engineSays(0, 2, 0.1)) // batching, no step read
	holding(t, s).upTo(4)
	waiting := later(engineSays(2, 2, 0.27), time.Second)
	for at := time.Duration(0); at < stepsToFull*maxStep; at += fullGap {
		s.engineSample("a", later(waiting, at))
		if s.replicas["a"].eng.full {
			t.Fatalf("two waiting behind 2 running, its step unknown: full after %v, want %v", at, stepsToFull*maxStep)
		}
	}
	s.engineSample("a", later(waiting, stepsToFull*maxStep))
	if !s.replicas["a"].eng.full {
		t.Fatalf("two waiting behind 2 running for %v: not full", stepsToFull*maxStep)
	}
}

// A batching engine whose first steps queued the probe for fullAfter (a
// long prefill, or steps slowed by engines sharing its GPU) looks like a
// one-at-a-time server at first; the first sample with two running says
// it batches, and its slots come from its metrics again. (Left to the
// learned limit, one engine of four sharing a GPU took twice its peers'
// requests while they were held at what they ran: TTFT p99 5× round
// robin's.)
func TestTwoRunningRevokesOneAtATime(t *testing.T) {
	s, l1, l2 := probeQueuedBehindOne(t) // behind a slow first step
	defer l1.Release(success(time.Millisecond))
	defer l2.Release(success(time.Millisecond))
	if !s.replicas["a"].eng.single {
		t.Fatal("setup: not marked one-at-a-time")
	}
	s.engineSample("a", engineSays(0, 2, 0.2)) // the step admitted it: two at once
	if e := s.replicas["a"].eng; e.single || !e.batching {
		t.Fatalf("two running: single %v batching %v, want a batching engine", e.single, e.batching)
	}
	if from := s.Snapshot().Replicas[0].SlotsFrom; from != slotsEngine {
		t.Fatalf("slots from %q, want %q", from, slotsEngine)
	}
}

// An engine seen full that shows room again gets its own figure back (a
// quarter more than it ran), not the learned limit, which the first
// bytes of a long ramp may have grown far beyond any engine's room.
func TestRoomAfterFullIsTheEnginesFigureNotTheLearnedLimit(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a"})
	s.engineSample("a", engineSays(0, 0, 0))
	var held []*Lease
	defer func() {
		for _, l := range held {
			l.Release(success(time.Millisecond))
		}
	}()
	held = append(held, mustAcquire(t, s))
	s.engineSample("a", engineSays(0, 1, 0.1))
	held = append(held, mustAcquire(t, s))
	s.engineSample("a", engineSays(0, 2, 0.2)) // batching
	for len(held) < 20 {
		s.engineSample("a", engineSays(0, len(held), 0.5))
		held = append(held, mustAcquire(t, s))
	}
	s.engineSample("a", engineSays(0, 20, 0.99)) // KV full
	if got := s.Snapshot().Replicas[0].Parallelism; got != 20+fullBuffer(20) {
		t.Fatalf("full: %d slots, want the 20 it runs and %d", got, fullBuffer(20))
	}
	s.mu.Lock()
	s.replicas["a"].lim.limit = 64 // slow start ran ahead
	s.mu.Unlock()
	s.engineSample("a", engineSays(0, 20, 0.9)) // room again
	if got := s.Snapshot().Replicas[0]; got.Parallelism != 25 || got.SlotsFrom != slotsEngine {
		t.Fatalf("room after full: %d slots from %q, want 25 (20 and a quarter) from the engine", got.Parallelism, got.SlotsFrom)
	}
}
