package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestExactlyOnceUnderStress throws concurrent enqueues, dispatches,
// expiries, cancellations, a reload and finally a shutdown at one
// controller, and checks every request got exactly one outcome: what the
// callers saw matches the counters, the counters add up, and nothing is
// left queued or in flight.
func TestExactlyOnceUnderStress(t *testing.T) {
	const workers, perWorker = 16, 400
	cfg := Config{
		MaxRequests: 12, // small limits, so capacity rejections happen too
		Bands: []BandConfig{
			{Priority: 100, Fairness: "round_robin", Ordering: "edf", MaxRequests: 4},
			{Priority: 0, Fairness: "global_strict", Ordering: "slo_deadline", MaxBytes: 4000},
			{Priority: -10, Fairness: "round_robin", Ordering: "fcfs", MaxRequests: 2},
		},
		PollInterval: time.Millisecond,
	}
	c, err := New(cfg, slots(2))
	if err != nil {
		t.Fatal(err)
	}
	var seen [EvictedOther + 1]atomic.Uint64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 42))
			for i := 0; i < perWorker; i++ {
				req := Request{
					FlowID:   fmt.Sprint("tenant-", rng.IntN(12)),
					Priority: []int{100, 0, -10, 7}[rng.IntN(4)],
					Bytes:    rng.Int64N(2000),
					Tokens:   rng.Int64N(100),
					TTL:      time.Duration(rng.IntN(3000)) * time.Microsecond,
				}
				if rng.IntN(2) == 0 {
					req.SLOTTFT = time.Duration(rng.IntN(50)) * time.Millisecond
				}
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(4) == 0 {
					time.AfterFunc(time.Duration(rng.IntN(500))*time.Microsecond, cancel)
				}
				tk, err := c.Enqueue(ctx, req)
				switch {
				case err == nil:
					seen[Dispatched].Add(1)
					if rng.IntN(2) == 0 {
						runtime.Gosched()
					}
					if !tk.Release() || tk.Release() {
						t.Error("Release not exactly once")
					}
				case errors.Is(err, ErrCapacity):
					seen[RejectedCapacity].Add(1)
				case errors.Is(err, ErrTTL):
					seen[EvictedTTL].Add(1)
				case errors.Is(err, context.Canceled):
					seen[EvictedContextCancelled].Add(1)
				case errors.Is(err, ErrShutdown):
					seen[EvictedOther].Add(1) // RejectedOther and EvictedOther: told apart below
				default:
					t.Errorf("unexpected error %v", err)
				}
				cancel()
			}
		}(uint64(w))
	}
	// Reload mid-flight (limits and policies change under the waiters),
	// then shut down while requests are still coming.
	received := func(n uint64) func() bool {
		return func() bool { return c.Snapshot().Counters.Received >= n }
	}
	eventually(t, "a third of the traffic", received(workers*perWorker/3))
	reload := cfg
	reload.Bands = append([]BandConfig{}, cfg.Bands...)
	reload.Bands[0].Fairness, reload.Bands[2].Ordering = "global_strict", "edf"
	if err := c.Reconfigure(reload, slots(3)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "most of the traffic", received(workers*perWorker*9/10))
	c.Close()
	wg.Wait()

	s := c.Snapshot()
	n := s.Counters
	total := n.Dispatched + n.RejectedCapacity + n.RejectedOther + n.EvictedTTL + n.EvictedContextCancelled + n.EvictedOther
	if n.Received != workers*perWorker || total != n.Received {
		t.Fatalf("received %d, outcomes sum %d, want %d: %+v", n.Received, total, workers*perWorker, n)
	}
	checks := []struct {
		name      string
		saw, want uint64
	}{
		{"dispatched", seen[Dispatched].Load(), n.Dispatched},
		{"capacity", seen[RejectedCapacity].Load(), n.RejectedCapacity},
		{"ttl", seen[EvictedTTL].Load(), n.EvictedTTL},
		{"cancelled", seen[EvictedContextCancelled].Load(), n.EvictedContextCancelled},
		{"shutdown", seen[EvictedOther].Load(), n.EvictedOther + n.RejectedOther},
		{"released", seen[Dispatched].Load(), n.Released},
	}
	for _, c := range checks {
		if c.saw != c.want {
			t.Errorf("%s: callers saw %d, counters say %d", c.name, c.saw, c.want)
		}
	}
	if s.Queued != 0 || s.Bytes != 0 || s.InFlight != (InFlight{}) {
		t.Fatalf("left over: queued %d, bytes %d, in flight %+v", s.Queued, s.Bytes, s.InFlight)
	}
	t.Logf("outcomes: %+v", n)
}
