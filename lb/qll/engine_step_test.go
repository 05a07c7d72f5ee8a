package qll

import (
	"testing"
	"time"
)

// A batching engine whose steps are long (four engines sharing one GPU:
// 300-600 ms) keeps requests waiting for more than fullAfter while it
// has room: each waits a step or two for the one that admits it. Its
// step, read from the samples in which its running count changes, sets
// how long they must wait before it counts as full: three steps. Taken
// for full after 300 ms, the calibrated engines of the four-on-one-GPU
// run were cut to what they ran at a fifth to half of their KV cache in
// the first seconds, grew a quarter per sample from then on, and held
// requests at the edge while round robin sent them in.
func TestAnEngineWithLongStepsGetsThreeStepsBeforeFull(t *testing.T) {
	const step = 400 * time.Millisecond
	s := batchingEngine()
	at := time.Now()
	sample := func(waiting, running int) {
		smp := engineSays(waiting, running, 0.4)
		smp.At = at
		s.engineSample("a", smp)
	}
	// Read every 50 ms while it admits one a step: 8, 9, 10, 11, 12.
	running := 8
	for i := 0; i < 4; i++ {
		for d := time.Duration(0); d < step; d += 50 * time.Millisecond {
			sample(1, running)
			at = at.Add(50 * time.Millisecond)
		}
		running++
	}
	eng := func() engineView { return s.replicas["a"].eng }
	if got := eng().steps.estimate(); got < step-50*time.Millisecond || got > step {
		t.Fatalf("step read as %v from samples 50 ms apart changing every %v", got, step)
	}
	// Then 4 wait behind 12 running for 1.1 s: under three of its steps.
	for d := time.Duration(0); d <= 1100*time.Millisecond; d += 50 * time.Millisecond {
		sample(4, running)
		at = at.Add(50 * time.Millisecond)
		if eng().full {
			t.Fatalf("full after %v of 4 waiting behind %d, with steps of %v", d, running, step)
		}
	}
	for d := time.Duration(0); d <= 200*time.Millisecond; d += 50 * time.Millisecond {
		sample(4, running)
		at = at.Add(50 * time.Millisecond)
	}
	if !eng().full {
		t.Fatalf("not full after 1.3 s of 4 waiting behind %d, with steps of %v", running, step)
	}
}

// The step is read only from samples close together: a change seen
// after a longer gap (a scrape a second apart) says when it happened
// within that second, no better; and a step read is at most maxStep.
func TestStepsAreReadOnlyFromSamplesCloseTogether(t *testing.T) {
	var c stepClock
	at := time.Now()
	c.note(at, true, false)
	c.note(at.Add(time.Second), true, false) // a second apart: no step
	if got := c.estimate(); got != 0 {
		t.Fatalf("step %v from samples a second apart", got)
	}
	at = at.Add(time.Second)
	for i := 1; i <= 4; i++ {
		c.note(at.Add(time.Duration(i)*fullGap), i == 1 || i == 4, true) // changed, then 3 samples later
	}
	if got := c.estimate(); got != 3*fullGap {
		t.Fatalf("step %v, want %v", got, 3*fullGap)
	}
	var slow stepClock
	slow.note(at, true, true)
	for i := 1; i <= 40; i++ {
		slow.note(at.Add(time.Duration(i)*100*time.Millisecond), i%20 == 0, true)
	}
	if got := slow.estimate(); got != maxStep {
		t.Fatalf("step %v from changes 2 s apart, want at most %v", got, maxStep)
	}
}
