package flow

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// sharedGate is a detector like flow/redisgate's: n requests in flight
// here, and a share per tenant (band 0) that the pool handed this
// instance.
type sharedGate struct {
	limit
	shares *FlowShares
}

func (g *sharedGate) Saturation(in InFlight) Verdict {
	v := g.limit.Saturation(in)
	v.Shares = g.shares
	return v
}

func tenantShares(shares map[string]float64) *FlowShares {
	s := &FlowShares{Of: map[FlowKey]float64{}}
	for id, n := range shares {
		s.Of[FlowKey{0, id}] = n
	}
	return s
}

// readDemand is what the controller published to feed, read exactly.
func readDemand(feed *DemandFeed, tokens bool) (d Demand) {
	feed.Read(tokens, func(got Demand) { d = got })
	return d
}

// A unit the pool handed this instance for the quiet tenant goes to it,
// not to the flood whose turn it is in the local round robin; with no
// share known the band's fairness decides as before.
func TestUnitGoesToTheFlowBelowItsShare(t *testing.T) {
	g := &sharedGate{shares: tenantShares(map[string]float64{"B": 1, "A": 1})}
	g.n.Store(1)
	feed := NewDemandFeed()
	c := newController(t, Config{}, g, PublishDemand(feed))
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

	// Per-flow in-flight counts are kept only for a published feed, and
	// come back to nothing.
	if flows := readDemand(feed, false).Flows; len(flows) != 0 {
		t.Fatalf("flows after everything ended: %+v", flows)
	}
}

// A demand feed reports, per tenant and band, what is in flight and what
// waits, signals every change, and keeps totals readable without the
// controller's lock.
func TestFlowDemandPerTenant(t *testing.T) {
	g := &sharedGate{}
	g.n.Store(1)
	feed := NewDemandFeed()
	if d := readDemand(feed, true); d.InFlight != (InFlight{}) || len(d.Flows) != 0 {
		t.Fatalf("a feed nobody publishes to: %+v", d)
	}
	c := newController(t, Config{}, g, PublishDemand(feed))
	if _, err := New(Config{}, g, PublishDemand(feed)); err == nil {
		t.Fatal("a second controller publishing to one feed")
	}
	out := make(chan result, 4)
	tk, err := c.Enqueue(context.Background(), Request{FlowID: "A", Tokens: 7})
	if err != nil {
		t.Fatal(err)
	}
	enqueueAsync(context.Background(), c, Request{FlowID: "B", Tokens: 5}, out)
	enqueueAsync(context.Background(), c, Request{FlowID: "B", Priority: 3, Tokens: 2}, out)
	waitQueued(t, c, 2)
	select {
	case <-feed.Changed():
	default:
		t.Fatal("no change signalled")
	}
	got := map[[2]any]FlowDemand{}
	d := readDemand(feed, true)
	if d.InFlight.Requests != 1 || d.Queued.Requests != 2 || d.Queued.Tokens != 7 {
		t.Errorf("totals in %+v queued %+v", d.InFlight, d.Queued)
	}
	if in, q := feed.Totals(); in != d.InFlight || q != d.Queued {
		t.Errorf("published totals in %+v queued %+v, read %+v %+v", in, q, d.InFlight, d.Queued)
	}
	for _, f := range d.Flows {
		got[[2]any{f.Priority, f.FlowID}] = f
	}
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

func (q *quarterPool) Saturation(in InFlight) Verdict {
	v := q.gate.Saturation(in)
	v.Capacity, v.QueueShare = 4, 0.25
	return v
}

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

// A feed's reader (flow/redisgate's gate, in its own goroutine since
// before the controller exists) may read the demand the moment New links
// the controller to the feed: New must have made everything the reading
// walks by then. It linked first and made the per-flow counts and the
// bands after, unlocked: a data race (go test -race), seen in CI.
func TestFeedReadWhileTheControllerIsMadeIsNoRace(t *testing.T) {
	cfg := Config{Bands: []BandConfig{{Priority: 0}, {Priority: 3}}}
	for range 20 {
		g := &slowFirstVerdict{}
		g.n.Store(1)
		feed := NewDemandFeed()
		done := make(chan struct{})
		read := make(chan struct{})
		go func() {
			defer close(read)
			for {
				select {
				case <-done:
					return
				default:
				}
				feed.Read(true, func(Demand) {})
			}
		}()
		c, err := New(cfg, g, PublishDemand(feed))
		if err != nil {
			t.Fatal(err)
		}
		close(done)
		<-read
		c.Close()
	}
}

// slowFirstVerdict takes a while over the first verdict New asks for,
// which leaves a reader of the feed time to read while New runs.
type slowFirstVerdict struct {
	sharedGate
	asked atomic.Bool
}

func (g *slowFirstVerdict) Saturation(in InFlight) Verdict {
	if !g.asked.Swap(true) {
		time.Sleep(2 * time.Millisecond)
	}
	return g.sharedGate.Saturation(in)
}
