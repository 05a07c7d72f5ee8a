package sim

import (
	"sync"
	"time"
)

// GPU is one accelerator shared by several simulated engines (Config.GPU):
// co-located engine processes take turns on it, as CUDA time-slices the
// kernels of separate processes, so a step's GPU work waits for the GPU
// work of the steps queued before it. BaseShare is the part of each
// step's fixed cost (Latency.StepBase) that is GPU work; the rest is the
// engine's own CPU time (scheduling, Python), which runs in parallel with
// the other engines. The per-token costs are GPU work.
type GPU struct {
	BaseShare float64

	mu   sync.Mutex
	free time.Time // when the GPU work queued so far ends
}

// NewGPU returns an idle GPU whose engines spend baseShare (0..1) of their
// step base on it.
func NewGPU(baseShare float64) *GPU { return &GPU{BaseShare: min(max(baseShare, 0), 1)} }

// occupy queues GPU work of d that is ready at `at` and returns when it
// ends: at once if the GPU is free then, else after the work ahead.
func (g *GPU) occupy(at time.Time, d time.Duration) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	start := at
	if g.free.After(start) {
		start = g.free
	}
	g.free = start.Add(d)
	return g.free
}

// stepEnd is when a step of duration d, with fixed part base, started at
// now ends on g: its CPU part first, then its GPU part in the GPU's queue.
func (g *GPU) stepEnd(now time.Time, d, base time.Duration) time.Time {
	cpu := time.Duration(float64(base) * (1 - g.BaseShare))
	cpu = min(cpu, d)
	return g.occupy(now.Add(cpu), d-cpu)
}
