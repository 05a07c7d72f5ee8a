package flow

import (
	"context"
	"sync"
	"testing"
)

// sharedGate is a detector like flow/redisgate's: n requests in flight
// here, and a share per tenant that the pool handed this instance.
type sharedGate struct {
	limit
	mu     sync.Mutex
	shares map[string]float64
	demand []FlowDemand
}

func (g *sharedGate) Demand(InFlight, InFlight) {}

func (g *sharedGate) ShareDeficit(_ int, id string, in InFlight) (float64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.shares[id]
	return s - float64(in.Requests), ok
}

// A unit the pool handed this instance for the quiet tenant goes to it,
// not to the flood whose turn it is in the local round robin; with no
// share known the band's fairness decides as before.
func TestUnitGoesToTheFlowBelowItsShare(t *testing.T) {
	g := &sharedGate{shares: map[string]float64{"B": 1, "A": 1}}
	g.n.Store(1)
	c := newController(t, Config{}, g)
	out := make(chan result, 8)
	first, err := c.Enqueue(context.Background(), Request{FlowID: "B"})
	if err != nil {
		t.Fatal(err)
	}
	// B queues first, then A: round robin would serve B next.
	enqueueAsync(context.Background(), c, Request{FlowID: "B"}, out)
	waitQueued(t, c, 1)
	enqueueAsync(context.Background(), c, Request{FlowID: "A"}, out)
	waitQueued(t, c, 2)
	// B holds its share (1 in flight), A none of its 1.
	g.n.Store(2) // the pool handed this instance a second unit
	c.Kick()
	r := <-out
	if r.err != nil || r.req.FlowID != "A" {
		t.Fatalf("the unit went to %q (%v), want A, below its share", r.req.FlowID, r.err)
	}
	r.ticket.Release()
	first.Release()
	r = <-out
	r.ticket.Release()

	// Per-flow in-flight counts are kept only for such detectors, and
	// come back to nothing.
	var flows []FlowDemand
	c.WithFlowDemand(false, func(_, _ InFlight, f []FlowDemand) { flows = f })
	if len(flows) != 0 {
		t.Fatalf("flows after everything ended: %+v", flows)
	}
}

// WithFlowDemand reports, per tenant and band, what is in flight and what
// waits.
func TestFlowDemandPerTenant(t *testing.T) {
	g := &sharedGate{}
	g.n.Store(1)
	c := newController(t, Config{}, g)
	out := make(chan result, 4)
	tk, err := c.Enqueue(context.Background(), Request{FlowID: "A", Tokens: 7})
	if err != nil {
		t.Fatal(err)
	}
	enqueueAsync(context.Background(), c, Request{FlowID: "B", Tokens: 5}, out)
	enqueueAsync(context.Background(), c, Request{FlowID: "B", Priority: 3, Tokens: 2}, out)
	waitQueued(t, c, 2)
	got := map[[2]any]FlowDemand{}
	c.WithFlowDemand(true, func(in, q InFlight, flows []FlowDemand) {
		if in.Requests != 1 || q.Requests != 2 || q.Tokens != 7 {
			t.Errorf("totals in %+v queued %+v", in, q)
		}
		for _, f := range flows {
			got[[2]any{f.Priority, f.FlowID}] = f
		}
	})
	if a := got[[2]any{0, "A"}]; a.InFlight.Requests != 1 || a.InFlight.Tokens != 7 || a.Queued.Requests != 0 {
		t.Errorf("A: %+v", a)
	}
	if b := got[[2]any{0, "B"}]; b.Queued.Requests != 1 || b.Queued.Tokens != 5 {
		t.Errorf("B band 0: %+v", b)
	}
	if b := got[[2]any{3, "B"}]; b.Queued.Requests != 1 || b.Queued.Tokens != 2 {
		t.Errorf("B band 3: %+v", b)
	}
	tk.Release()
	for range 2 {
		r := <-out
		r.ticket.Release()
	}
}

// quarterPool is a closed gate of a pool of 4 shared by 4 instances.
type quarterPool struct{ gate }

func (*quarterPool) Capacity() int64        { return 4 }
func (*quarterPool) QueueFraction() float64 { return 0.25 }

// A quiet tenant arriving at a band queue the flood filled (its part of
// the pool's 16, 16 ÷ 4 instances, floored at 8) still gets in: the
// flood's newest goes.
func TestSharedBandQueueStillAdmitsTheQuietTenant(t *testing.T) {
	g := &quarterPool{}
	g.closed.Store(true)
	c := newController(t, Config{}, g)
	out := make(chan result, 8)
	for range 8 {
		enqueueAsync(context.Background(), c, Request{FlowID: "B"}, out)
	}
	waitQueued(t, c, 8)
	if lim := c.Snapshot().Bands[0].MaxRequests; lim != 8 {
		t.Fatalf("band limit %d, want 8", lim)
	}
	enqueueAsync(context.Background(), c, Request{FlowID: "B"}, out)
	if r := <-out; r.err != ErrCapacity || r.req.FlowID != "B" {
		t.Fatalf("a fifth B: %+v %v", r.req, r.err)
	}
	enqueueAsync(context.Background(), c, Request{FlowID: "A"}, out)
	if r := <-out; r.err != ErrCapacity || r.req.FlowID != "B" {
		t.Fatalf("A's arrival should push out B's newest: got %+v %v", r.req, r.err)
	}
	if s := c.Snapshot(); s.Queued != 8 {
		t.Fatalf("queued %d", s.Queued)
	}
}
