package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Reloads, cancellations, expiries and releases all at once, with the
// policies and limits changing at every reload: every request still gets
// exactly one answer, every byte and slot counted in is counted out, and
// the demand feed ends at zero.
func TestReloadStormKeepsTheBooks(t *testing.T) {
	const workers, perWorker = 12, 300
	feed := NewDemandFeed()
	policies := [][2]string{{"round_robin", "fcfs"}, {"global_strict", "edf"}, {"round_robin", "slo_deadline"}, {"global_strict", "fcfs"}}
	cfgAt := func(i int) Config {
		p := policies[i%len(policies)]
		return Config{
			MaxRequests: int64(4 + i%9), MaxBytes: int64(3000 + 500*(i%5)),
			Bands: []BandConfig{
				{Priority: 10, Fairness: p[0], Ordering: p[1], MaxRequests: int64(1 + i%4)},
				{Priority: 0, Fairness: p[0], Ordering: p[1], MaxBytes: int64(2000 + 100*(i%7))},
			},
			PollInterval: time.Millisecond,
		}
	}
	c, err := New(cfgAt(0), slots(2), PublishDemand(feed))
	if err != nil {
		t.Fatal(err)
	}
	var answered atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			for range perWorker {
				req := Request{
					FlowID:   fmt.Sprint("t", rng.IntN(20)),
					Priority: []int{10, 0, -5}[rng.IntN(3)],
					Bytes:    rng.Int64N(900),
					Tokens:   rng.Int64N(50),
					TTL:      time.Duration(1+rng.IntN(2000)) * time.Microsecond,
				}
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					time.AfterFunc(time.Duration(rng.IntN(300))*time.Microsecond, cancel)
				}
				tk, err := c.Enqueue(ctx, req)
				answered.Add(1)
				switch {
				case err == nil:
					if !tk.Release() {
						t.Error("first Release refused")
					}
				case errors.Is(err, ErrCapacity), errors.Is(err, ErrTTL), errors.Is(err, context.Canceled), errors.Is(err, ErrShutdown):
				default:
					t.Errorf("unexpected error %v", err)
				}
				cancel()
			}
		}(uint64(w))
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for i := 1; ; i++ {
		select {
		case <-done:
		default:
			if err := c.Reconfigure(cfgAt(i), slots(int64(1+i%3))); err != nil {
				t.Fatal(err)
			}
			continue
		}
		break
	}
	s := c.Snapshot()
	n := s.Counters
	total := n.Dispatched + n.RejectedCapacity + n.RejectedOther + n.EvictedTTL + n.EvictedContextCancelled + n.EvictedOther
	if n.Received != workers*perWorker || total != n.Received || n.Released != n.Dispatched || answered.Load() != workers*perWorker {
		t.Fatalf("received %d, outcomes %d, answered %d: %+v", n.Received, total, answered.Load(), n)
	}
	if s.Queued != 0 || s.Bytes != 0 || s.InFlight != (InFlight{}) {
		t.Fatalf("left over: queued %d, bytes %d, in flight %+v", s.Queued, s.Bytes, s.InFlight)
	}
	for _, b := range s.Bands {
		if b.Queued != 0 || b.Bytes != 0 || len(b.Flows) != 0 {
			t.Fatalf("band %d left over: %+v", b.Priority, b)
		}
	}
	var flows int
	feed.Read(true, func(d Demand) { flows = len(d.Flows) })
	if in, queued := feed.Totals(); in != (InFlight{}) || queued != (InFlight{}) || flows != 0 {
		t.Fatalf("feed left over: in flight %+v, queued %+v, %d flows", in, queued, flows)
	}
	c.Close()
	t.Logf("outcomes: %+v", n)
}
