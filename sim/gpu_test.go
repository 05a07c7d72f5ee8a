package sim

import (
	"testing"
	"time"
)

// Engines sharing a GPU take turns on it: GPU work ready while other
// work runs starts when that ends; ready on an idle GPU, at once.
func TestGPUWorkTakesTurns(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	g := NewGPU(1)
	for _, c := range []struct {
		at, d, want int // ms after t0
	}{
		{0, 100, 100},  // idle: at once
		{10, 50, 150},  // behind the first
		{20, 30, 180},  // behind both
		{300, 10, 310}, // idle again
	} {
		if got := g.occupy(t0.Add(ms(c.at)), ms(c.d)); !got.Equal(t0.Add(ms(c.want))) {
			t.Fatalf("work of %d ms ready at %d ms ends at %v, want %d ms", c.d, c.at, got.Sub(t0), c.want)
		}
	}
}

// A step's fixed cost is part CPU (the engine's own, run in parallel with
// the other engines) and part GPU (BaseShare); its per-token cost is GPU
// work. Only the GPU part waits for the other engines.
func TestAStepWaitsOnlyWithItsGPUPart(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	g := NewGPU(0.25)
	// Engine A: base 100 (25 GPU) + 20 of tokens: CPU 75 ms, then 45 on the GPU.
	if end := g.stepEnd(t0, ms(120), ms(100)); !end.Equal(t0.Add(ms(120))) {
		t.Fatalf("alone: ends at %v, want 120 ms", end.Sub(t0))
	}
	// Engine B starts at 50 ms: its CPU part ends at 125, the GPU is free
	// since 120: it ends at 125 + 45.
	if end := g.stepEnd(t0.Add(ms(50)), ms(120), ms(100)); !end.Equal(t0.Add(ms(170))) {
		t.Fatalf("second: ends at %v, want 170 ms", end.Sub(t0))
	}
	// Engine C starts at 60 ms: CPU until 135, then behind B's GPU work (until 170).
	if end := g.stepEnd(t0.Add(ms(60)), ms(120), ms(100)); !end.Equal(t0.Add(ms(215))) {
		t.Fatalf("third: ends at %v, want 215 ms", end.Sub(t0))
	}
	if g := NewGPU(3); g.BaseShare != 1 {
		t.Fatalf("share above 1 kept as %v", g.BaseShare)
	}
}

// Only the step-based engine has steps to share a GPU with.
func TestASharedGPUNeedsTheEngineModel(t *testing.T) {
	c := Config{Latency: Latency{Kind: LatencyFixed, Duration: time.Millisecond}, GPU: NewGPU(0.5)}
	if err := c.Validate(); err == nil {
		t.Fatal("a fixed-latency replica on a shared GPU was accepted")
	}
	e := CalibratedEngine(0.25)
	e.GPU = NewGPU(0.5)
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
}
