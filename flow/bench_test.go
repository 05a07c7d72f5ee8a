package flow

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkEnqueueDispatch measures the controller's own work per request
// at a steady 10k queued requests over 1k flows: admit and queue one
// (capacity checks, ordering heap, fairness update, TTL timer), then
// dispatch one (band, fairness pick, ordering head, accounting). It drives
// the locked core directly, so goroutine hand-off is not in the numbers
// (BenchmarkThroughput has it).
func BenchmarkEnqueueDispatch(b *testing.B) {
	for _, fair := range []string{"round_robin", "global_strict"} {
		for _, ord := range []string{"fcfs", "edf"} {
			b.Run(fair+"/"+ord, func(b *testing.B) {
				const queued, flows = 10_000, 1_000
				c, err := New(Config{Bands: []BandConfig{{Priority: 0, Fairness: fair, Ordering: ord, MaxRequests: 1 << 30}}}, &gate{})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				ids := make([]string, flows)
				for i := range ids {
					ids[i] = fmt.Sprint("tenant-", i)
				}
				enqueue := func(i int) {
					now := c.clock.Now()
					bd := c.bandLocked(0)
					if !c.fitsLocked(bd, 1000) {
						b.Fatal("over capacity")
					}
					w := c.pushLocked(bd, Request{FlowID: ids[i%flows], Bytes: 1000, TTL: time.Duration(i%7+1) * time.Hour}, now)
					w.timer = c.clock.AfterFunc(w.item.Deadline.Sub(now), func() { c.evict(w, EvictedTTL, nil) })
				}
				c.mu.Lock()
				for i := 0; i < queued; i++ {
					enqueue(i)
				}
				c.mu.Unlock()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c.mu.Lock()
					enqueue(i)
					bd := c.topBandLocked()
					c.resolveLocked(bd.fairness.Next().Head().Value.(*waiter), Dispatched)
					c.inFlight = InFlight{} // released at once
					c.mu.Unlock()
				}
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "dispatches/s")
			})
		}
	}
}

// BenchmarkThroughput pushes requests through the public API from many
// goroutines with 8 slots, so most of them queue and are dispatched by
// releases: end-to-end dispatches per second, hand-offs included.
func BenchmarkThroughput(b *testing.B) {
	c, err := New(Config{Bands: []BandConfig{{Priority: 0, Fairness: "round_robin", MaxRequests: 1 << 30}}}, slots(8))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			i := n.Add(1)
			t, err := c.Enqueue(ctx, Request{FlowID: fmt.Sprint("tenant-", i%1000)})
			if err != nil {
				b.Error(err)
				return
			}
			t.Release()
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "dispatches/s")
}
