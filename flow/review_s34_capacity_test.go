package flow

import (
	"context"
	"errors"
	"testing"
)

// At the global limit the arrival is refused whatever its priority, and
// nothing queued is displaced: the GIE's processor checks the global and
// band limits and rejects the arrival (hasCapacity, then
// QueueOutcomeRejectedCapacity); it has no displacement of queued
// requests. Lower bands are shed by their own limits, not by push-out.
func TestGlobalLimitRefusesAHigherBandArrivalAndDisplacesNothing(t *testing.T) {
	c := newController(t, Config{MaxRequests: 3, MaxBytes: 1000}, closedGate())
	low := make(chan result, 3)
	for i := range 3 {
		enqueueAsync(context.Background(), c, Request{Priority: -10, FlowID: "batch", Bytes: 10}, low)
		waitQueued(t, c, i+1)
	}
	if _, err := c.Enqueue(context.Background(), Request{Priority: 100, FlowID: "premium", Bytes: 10}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("higher band at the global limit: %v, want ErrCapacity", err)
	}
	mustNotReceive(t, low, "no queued request may be displaced")
	s := c.Snapshot()
	if s.Queued != 3 || s.Bytes != 30 || s.Counters.RejectedCapacity != 1 || s.Counters.Received != 4 {
		t.Fatalf("after the refusal: queued %d, bytes %d, %+v", s.Queued, s.Bytes, s.Counters)
	}
	for _, b := range s.Bands {
		if b.Priority == 100 && (b.Queued != 0 || len(b.Flows) != 0) {
			t.Fatalf("the refused request left a trace in its band: %+v", b)
		}
	}
}

// At the global limit a push-out stays within the arrival's band (the
// flooding flow's newest request), releases the victim's place and bytes
// once, and the queues then serve both tenants.
func TestGlobalLimitPushOutKeepsTheBooks(t *testing.T) {
	c := newController(t, Config{MaxRequests: 4, MaxBytes: 40, Bands: []BandConfig{{Priority: 0, MaxRequests: 100}}}, slots(1))
	held, err := c.Enqueue(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	flood := make(chan result, 5) // A's four, then B's
	for i := range 4 {
		enqueueAsync(context.Background(), c, Request{FlowID: "A", Bytes: 10}, flood)
		waitQueued(t, c, i+1)
	}
	// Global bytes full too: B's 15 bytes do not fit even without one of
	// A's, so nobody is pushed out for nothing.
	if _, err := c.Enqueue(context.Background(), Request{FlowID: "B", Bytes: 15}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("too big even after a push-out: %v", err)
	}
	mustNotReceive(t, flood, "a push-out that does not make room")
	enqueueAsync(context.Background(), c, Request{FlowID: "B", Bytes: 5}, flood)
	if r := <-flood; r.req.FlowID != "A" || !errors.Is(r.err, ErrCapacity) || r.ticket != nil {
		t.Fatalf("pushed out: %+v, %v", r.req, r.err)
	}
	waitQueued(t, c, 4)
	s := c.Snapshot()
	if s.Bytes != 35 || s.Bands[0].Bytes != 35 || len(s.Bands[0].Flows) != 2 ||
		s.Bands[0].Flows[0].Queued != 3 || s.Bands[0].Flows[1].Queued != 1 {
		t.Fatalf("after the push-out: %+v", s)
	}
	got := serveOneByOne(t, held, flood, 4)
	if got[0].FlowID != "A" || got[1].FlowID != "B" {
		t.Fatalf("round robin after the push-out: %+v", got)
	}
	s = c.Snapshot()
	n := s.Counters
	if s.Queued != 0 || s.Bytes != 0 || n.Received != 7 || n.Dispatched != 5 || n.RejectedCapacity != 2 {
		t.Fatalf("books: queued %d, bytes %d, %+v", s.Queued, s.Bytes, n)
	}
}

// A reload that lowers the global max_requests below what is queued keeps
// every waiter, counted once; arrivals are refused (none pushing anyone
// out, which would not make room) until the queue is under the new limit.
func TestReloadLoweringGlobalMaxRequestsStrandsNobody(t *testing.T) {
	c := newController(t, Config{MaxRequests: 10}, slots(1))
	held, err := c.Enqueue(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 10)
	for i := range 5 {
		enqueueAsync(context.Background(), c, Request{FlowID: []string{"A", "A", "A", "B", "B"}[i], Bytes: 1}, out)
		waitQueued(t, c, i+1)
	}
	if err := c.Reconfigure(Config{MaxRequests: 2}, nil); err != nil {
		t.Fatal(err)
	}
	if s := c.Snapshot(); s.Queued != 5 || s.Bytes != 5 || s.Bands[0].Queued != 5 {
		t.Fatalf("after the reload: %+v", s)
	}
	if _, err := c.Enqueue(context.Background(), Request{FlowID: "C"}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("over the lowered limit: %v", err)
	}
	mustNotReceive(t, out, "nobody is pushed out or dropped by the reload")
	// Serve until one is left: then the limit of 2 admits an arrival.
	for range 4 {
		held.Release()
		r := <-out
		if r.err != nil {
			t.Fatal(r.err)
		}
		held = r.ticket
	}
	enqueueAsync(context.Background(), c, Request{FlowID: "C"}, out)
	waitQueued(t, c, 2)
	for range 2 {
		held.Release()
		r := <-out
		if r.err != nil {
			t.Fatal(r.err)
		}
		held = r.ticket
	}
	held.Release()
	s := c.Snapshot()
	n := s.Counters
	if s.Queued != 0 || s.Bytes != 0 || s.InFlight != (InFlight{}) || n.Received != 8 ||
		n.Dispatched != 7 || n.RejectedCapacity != 1 || n.Released != 7 {
		t.Fatalf("books: %+v", s)
	}
}
