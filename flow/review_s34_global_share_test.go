package flow

import (
	"context"
	"testing"
	"time"
)

// With the pool's count shared through Redis, each instance queues its
// part of the pool's band queue (the band's limit ÷ the instances); the
// global max_requests is a limit of the pool's queue too, so each of N
// instances holds its part of it, not all of it (N instances held N× the
// global limit: max_requests 40 over 4 instances queued 160). As the
// GIE partitions both its global and its band limits over its shards.
func TestSharedPoolGlobalLimitIsThisInstancesPart(t *testing.T) {
	g := &quarterPool{}
	g.closed.Store(true)
	c := newController(t, Config{MaxRequests: 40, Bands: []BandConfig{{Priority: 0, MaxRequests: 1000}}}, g)
	out := make(chan result, 64)
	refused := 0
	for i := range 30 {
		enqueueAsync(context.Background(), c, Request{FlowID: "A"}, out)
		deadline := time.Now().Add(5 * time.Second)
		for c.Snapshot().Queued+refused < i+1 {
			select {
			case r := <-out:
				if r.err != ErrCapacity {
					t.Fatalf("%+v %v", r.req, r.err)
				}
				refused++
			default:
				if time.Now().After(deadline) {
					t.Fatalf("request %d neither queued nor refused", i+1)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	if q := c.Snapshot().Queued; q != 10 {
		t.Fatalf("queued %d at one of 4 instances sharing max_requests 40, want 10 (its part)", q)
	}
}
