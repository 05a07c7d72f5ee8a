package sim

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// checkKV checks the engine's block accounting against its requests: every
// registered block's refs is the number of running requests holding it,
// pinned blocks are out of the LRU and unpinned ones in it, private is the
// sum of the running requests' reservations, and free + cached + pinned +
// private is the whole cache.
func checkKV(t *testing.T, e *engine, when string) {
	t.Helper()
	refs := map[*kvBlock]int{}
	private := 0
	for _, r := range e.running {
		private += r.reserved
		for _, b := range r.shared {
			refs[b]++
		}
	}
	pinned := 0
	for _, b := range e.blocks {
		if b.refs != refs[b] {
			t.Fatalf("%s: block refs %d, held by %d running", when, b.refs, refs[b])
		}
		if b.refs > 0 {
			pinned++
			if b.elem != nil {
				t.Fatalf("%s: pinned block in lru", when)
			}
		} else if b.elem == nil {
			t.Fatalf("%s: unpinned block not in lru", when)
		}
	}
	if pinned != e.pinned || private != e.private || e.free < 0 {
		t.Fatalf("%s: pinned %d (counted %d), private %d (counted %d), free %d", when, pinned, e.pinned, private, e.private, e.free)
	}
	if s := e.free + e.lru.Len() + e.pinned + e.private; s != e.kvBlocks || e.lru.Len()+e.pinned != len(e.blocks) {
		t.Fatalf("%s: free %d + cached %d + pinned %d + private %d = %d, want %d; map %d", when, e.free, e.lru.Len(), e.pinned, e.private, s, e.kvBlocks, len(e.blocks))
	}
	for _, r := range e.running {
		if r.generated > r.out {
			t.Fatalf("%s: generated %d > out %d", when, r.generated, r.out)
		}
	}
}

// TestEngineKVAccountingInvariant drives the scheduler by hand with random
// arrivals (three shared leads, prompts with extra text past 4 characters
// per token), random KV sizes, budgets, seats and async scheduling, and
// removes random requests (waiting, running, mid-step, already done)
// between a step's plan and its end; the accounting holds after every
// change and nothing stays pinned or reserved once every request is gone.
func TestEngineKVAccountingInvariant(t *testing.T) {
	for seed := range uint64(100) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { kvAccountingRun(t, seed) })
	}
}

func kvAccountingRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	cfg := engineConfig(0, 0)
	cfg.KVBlocks = 10 + rng.IntN(40)
	cfg.MaxBatchTokens = 8 + rng.IntN(200)
	cfg.Concurrency = 1 + rng.IntN(8)
	cfg.Latency.AsyncScheduling = rng.IntN(2) == 0
	e := engineDirect(cfg)
	var all []*engineReq
	var work []stepItem
	now := time.Now()
	var inFlight time.Time
	for step := 0; step < 400; step++ {
		for range rng.IntN(3) {
			lead := byte('a' + rng.IntN(3))
			tokens := 1 + rng.IntN(120)
			text := []byte(string(lead) + strings.Repeat("abcd", tokens)[1:])
			if rng.IntN(4) == 0 {
				text = append(text, strings.Repeat("x", rng.IntN(300))...)
			}
			r, fits := e.newRequest(tokens, 1+rng.IntN(20), newPromptPrefix(text, e.blockChars(), e.kvBlocks))
			if !fits {
				continue
			}
			r.since = now.Add(time.Duration(rng.IntN(2))) // after the step in flight started, or not
			r.state = reqWaiting
			r.elem = e.waiting.PushBack(r)
			all = append(all, r)
		}
		now = now.Add(time.Millisecond)
		work, _, _ = e.planStepLocked(work[:0], inFlight)
		inFlight = now
		checkKV(t, e, "after plan")
		for range rng.IntN(2) {
			if len(all) > 0 {
				e.remove(all[rng.IntN(len(all))])
			}
		}
		checkKV(t, e, "after remove")
		e.applyLocked(work)
		checkKV(t, e, "after apply")
	}
	for _, r := range all {
		e.remove(r)
	}
	checkKV(t, e, "end")
	if e.pinned != 0 || e.private != 0 || len(e.running) != 0 || e.waiting.Len() != 0 {
		t.Fatalf("end: pinned %d, private %d, running %d, waiting %d; want none", e.pinned, e.private, len(e.running), e.waiting.Len())
	}
}
