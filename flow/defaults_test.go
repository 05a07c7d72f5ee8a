package flow

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// What a configuration that sets no band gets: round-robin fairness and a
// queue bounded by the pool's capacity.

func TestUnconfiguredBandIsRoundRobin(t *testing.T) {
	c := newController(t, Config{}, slots(1))
	held, _ := c.Enqueue(context.Background(), Request{})
	out := make(chan result, 20)
	for i := 0; i < 6; i++ {
		enqueueAsync(context.Background(), c, Request{FlowID: "flood"}, out)
		waitQueued(t, c, i+1)
	}
	enqueueAsync(context.Background(), c, Request{FlowID: "quiet"}, out)
	waitQueued(t, c, 7)
	got := serveOneByOne(t, held, out, 7)
	// global_strict (the seed's default) would serve it last, after the
	// whole flood that arrived before it.
	if got[0].FlowID != "quiet" && got[1].FlowID != "quiet" {
		t.Fatalf("dispatch order %v: the quiet tenant must get the next turn", flows(got))
	}
}

func flows(rs []Request) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.FlowID
	}
	return out
}

func TestBandQueueLimit(t *testing.T) {
	cases := []struct {
		max, capacity, want int64
	}{
		{0, 4, 16}, // 4 × capacity
		{0, 1, DefaultBandMinRequests},
		{0, 100, 400},
		{50, 4, 50}, // max_requests wins
		{3, 100, 3},
	}
	for _, tc := range cases {
		if got := BandQueueLimit(BandConfig{MaxRequests: tc.max}, tc.capacity); got != tc.want {
			t.Errorf("max_requests %d, capacity %d: limit %d, want %d", tc.max, tc.capacity, got, tc.want)
		}
	}
}

// fill puts n requests of flow id in the queue of a saturated controller
// and returns how many were refused for capacity.
func fill(t *testing.T, c *Controller, id string, n int, out chan result) (refused int) {
	t.Helper()
	for i := 0; i < n; i++ {
		before := c.Snapshot().Queued
		enqueueAsync(context.Background(), c, Request{FlowID: id}, out)
		eventually(t, "the request queued or refused", func() bool {
			if c.Snapshot().Queued > before {
				return true
			}
			select {
			case r := <-out:
				if !errors.Is(r.err, ErrCapacity) {
					t.Fatalf("got %v, want a place in the queue or ErrCapacity", r.err)
				}
				refused++
				return true
			default:
				return false
			}
		})
	}
	return refused
}

func TestDefaultBandLimitFollowsTheReplicaCount(t *testing.T) {
	var replicas atomic.Int64
	replicas.Store(4)
	det := NewConcurrencyDetector(DetectorConfig{Type: DetectorConcurrency, MaxConcurrency: 1},
		func() int { return int(replicas.Load()) })
	c := newController(t, Config{}, det)
	for i := 0; i < 4; i++ { // the pool's 4 slots
		if _, err := c.Enqueue(context.Background(), Request{}); err != nil {
			t.Fatal(err)
		}
	}
	out := make(chan result, 100)
	if n := fill(t, c, "flood", 20, out); n != 4 {
		t.Fatalf("4 replicas × 1: %d of 20 refused, want 4 (queue of 16 = 4 × capacity)", n)
	}
	if s := c.Snapshot(); s.Queued != 16 || s.Bands[0].MaxRequests != 16 {
		t.Fatalf("queued %d, band limit %d; want 16 and 16", s.Queued, s.Bands[0].MaxRequests)
	}
	// Two replicas more: the limit grows with them (the two new slots
	// take two queued requests at the next dispatch).
	replicas.Store(6)
	c.Kick()
	for i := 0; i < 2; i++ {
		if r := <-out; r.err != nil {
			t.Fatalf("dispatched to a new slot: %v", r.err)
		}
	}
	waitQueued(t, c, 14)
	if n := fill(t, c, "flood", 12, out); n != 2 {
		t.Fatalf("6 replicas: %d of 12 refused, want 2 (queue of 24)", n)
	}
}

func TestDefaultBandLimitWithoutDetectorCapacity(t *testing.T) {
	// A detector that cannot say its capacity in requests (utilization,
	// tokens mode): what was in flight when the queue formed stands for it.
	l := &limit{}
	l.n.Store(5)
	c := newController(t, Config{}, l)
	for i := 0; i < 5; i++ {
		if _, err := c.Enqueue(context.Background(), Request{}); err != nil {
			t.Fatal(err)
		}
	}
	out := make(chan result, 100)
	if n := fill(t, c, "x", 25, out); n != 5 {
		t.Fatalf("%d of 25 refused, want 5 (queue of 20 = 4 × 5 in flight)", n)
	}
}
