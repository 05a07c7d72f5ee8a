package flow

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestPassThroughWhenNotSaturated(t *testing.T) {
	c := newController(t, Config{}, &gate{})
	for i := 0; i < 3; i++ {
		tk, err := c.Enqueue(context.Background(), Request{FlowID: "a", Bytes: 10, Tokens: 5})
		if err != nil || tk == nil {
			t.Fatalf("Enqueue = %v, %v", tk, err)
		}
		if tk.Waited != 0 {
			t.Fatalf("waited %v on pass-through", tk.Waited)
		}
		s := c.Snapshot()
		if s.Queued != 0 || s.InFlight != (InFlight{Requests: 1, Tokens: 5}) {
			t.Fatalf("after pass-through: queued %d, in flight %+v", s.Queued, s.InFlight)
		}
		if !tk.Release() || tk.Release() {
			t.Fatal("Release must succeed once, then report false")
		}
	}
	s := c.Snapshot()
	if s.InFlight != (InFlight{}) || s.Counters.Dispatched != 3 || s.Counters.Released != 3 {
		t.Fatalf("snapshot %+v", s)
	}
}

func TestStrictPriority(t *testing.T) {
	c := newController(t, Config{Bands: []BandConfig{{Priority: 100}, {Priority: 0}, {Priority: -10, MaxRequests: 1000}}}, slots(1))
	held, err := c.Enqueue(context.Background(), Request{Priority: -10})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 300)
	for i := 0; i < 200; i++ {
		enqueueAsync(context.Background(), c, Request{FlowID: fmt.Sprint("batch-", i%7), Priority: -10}, out)
	}
	waitQueued(t, c, 200)
	enqueueAsync(context.Background(), c, Request{FlowID: "premium", Priority: 100}, out)
	enqueueAsync(context.Background(), c, Request{FlowID: "std", Priority: 0}, out)
	waitQueued(t, c, 202)
	mustNotReceive(t, out, "saturated pool dispatched")

	// The one slot frees: the premium request takes it, ahead of 200
	// earlier sheddable ones; the next goes to priority 0.
	held.Release()
	r := <-out
	if r.err != nil || r.req.Priority != 100 {
		t.Fatalf("first dispatch after release: priority %d, err %v", r.req.Priority, r.err)
	}
	mustNotReceive(t, out, "one slot, two dispatches")
	r.ticket.Release()
	r = <-out
	if r.req.Priority != 0 {
		t.Fatalf("second dispatch: priority %d, want 0", r.req.Priority)
	}
	r.ticket.Release()
	for i := 0; i < 200; i++ {
		r = <-out
		if r.err != nil || r.req.Priority != -10 {
			t.Fatalf("drain: %+v %v", r.req, r.err)
		}
		r.ticket.Release()
	}
}

// serveOneByOne releases the held ticket and then each dispatched one in
// turn, returning the first n dispatched requests in order.
func serveOneByOne(t *testing.T, held *Ticket, out <-chan result, n int) []Request {
	t.Helper()
	held.Release()
	var got []Request
	for len(got) < n {
		r := <-out
		if r.err != nil {
			t.Fatalf("request %+v: %v", r.req, r.err)
		}
		got = append(got, r.req)
		r.ticket.Release()
	}
	return got
}

func TestRoundRobinFairShares(t *testing.T) {
	c := newController(t, Config{Bands: []BandConfig{{Priority: 0, Fairness: "round_robin", MaxRequests: 1000}}}, slots(1))
	held, _ := c.Enqueue(context.Background(), Request{})
	out := make(chan result, 300)
	// The heavy tenant sends ten times more, and first.
	for i := 0; i < 200; i++ {
		enqueueAsync(context.Background(), c, Request{FlowID: "heavy"}, out)
	}
	waitQueued(t, c, 200)
	for i := 0; i < 20; i++ {
		enqueueAsync(context.Background(), c, Request{FlowID: "light"}, out)
	}
	waitQueued(t, c, 220)
	got := serveOneByOne(t, held, out, 40)
	n := map[string]int{}
	for _, r := range got {
		n[r.FlowID]++
	}
	if d := n["heavy"] - n["light"]; d < -1 || d > 1 {
		t.Fatalf("shares over 40 dispatches: %v, want equal ±1", n)
	}
}

func TestGlobalStrictServesArrivalOrder(t *testing.T) {
	c := newController(t, Config{Bands: []BandConfig{{Priority: 0, Fairness: "global_strict", MaxRequests: 1000}}}, slots(1))
	held, _ := c.Enqueue(context.Background(), Request{})
	out := make(chan result, 100)
	for i := 0; i < 20; i++ {
		enqueueAsync(context.Background(), c, Request{FlowID: "heavy", Bytes: int64(i)}, out)
		waitQueued(t, c, i+1)
	}
	enqueueAsync(context.Background(), c, Request{FlowID: "light"}, out)
	waitQueued(t, c, 21)
	got := serveOneByOne(t, held, out, 21)
	for i := 0; i < 20; i++ {
		if got[i].FlowID != "heavy" || got[i].Bytes != int64(i) {
			t.Fatalf("dispatch %d: %+v, want heavy #%d (one global FCFS order)", i, got[i], i)
		}
	}
	if got[20].FlowID != "light" {
		t.Fatalf("last dispatch %+v", got[20])
	}
}

func TestOrderingWithinFlow(t *testing.T) {
	cases := []struct {
		ordering string
		reqs     []Request
		want     []int64 // Bytes used as a request id
	}{
		{"fcfs", []Request{{Bytes: 1, TTL: time.Minute}, {Bytes: 2, TTL: time.Second}, {Bytes: 3}}, []int64{1, 2, 3}},
		{"edf", []Request{{Bytes: 1, TTL: 30 * time.Second}, {Bytes: 2, TTL: 10 * time.Second}, {Bytes: 3, TTL: 20 * time.Second}}, []int64{2, 3, 1}},
		{"slo_deadline", []Request{{Bytes: 1}, {Bytes: 2, SLOTTFT: 2 * time.Second}, {Bytes: 3}, {Bytes: 4, SLOTTFT: time.Second}}, []int64{4, 2, 1, 3}},
	}
	for _, tc := range cases {
		t.Run(tc.ordering, func(t *testing.T) {
			c := newController(t, Config{Bands: []BandConfig{{Priority: 0, Ordering: tc.ordering}}}, slots(1), WithClock(newFakeClock()))
			held, _ := c.Enqueue(context.Background(), Request{})
			out := make(chan result, 10)
			for i, r := range tc.reqs {
				r.FlowID = "tenant"
				enqueueAsync(context.Background(), c, r, out)
				waitQueued(t, c, i+1)
			}
			got := serveOneByOne(t, held, out, len(tc.reqs))
			for i, r := range got {
				if r.Bytes != tc.want[i] {
					t.Fatalf("dispatch order %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestCapacityLimits(t *testing.T) {
	cfg := Config{
		MaxBytes: 1000,
		Bands: []BandConfig{
			{Priority: 1, MaxRequests: 2},
			{Priority: 0, MaxBytes: 100},
		},
	}
	c := newController(t, cfg, closedGate())
	out := make(chan result, 10)
	enqueueAsync(context.Background(), c, Request{Priority: 1}, out)
	enqueueAsync(context.Background(), c, Request{Priority: 1}, out)
	waitQueued(t, c, 2)
	if _, err := c.Enqueue(context.Background(), Request{Priority: 1}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("band max_requests: err %v, want ErrCapacity", err)
	}
	// Band 0's bytes are its own: band 1's full count does not matter.
	enqueueAsync(context.Background(), c, Request{Priority: 0, Bytes: 60}, out)
	waitQueued(t, c, 3)
	if _, err := c.Enqueue(context.Background(), Request{Priority: 0, Bytes: 41}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("band max_bytes: err %v, want ErrCapacity", err)
	}
	enqueueAsync(context.Background(), c, Request{Priority: 0, Bytes: 40}, out) // exactly fills the band
	waitQueued(t, c, 4)
	// Global max_bytes counts every band: 100 queued, 901 more is over 1000.
	if _, err := c.Enqueue(context.Background(), Request{Priority: 5, Bytes: 901}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("global max_bytes: err %v, want ErrCapacity", err)
	}
	s := c.Snapshot()
	if s.Counters.RejectedCapacity != 3 || s.Queued != 4 || s.Bytes != 100 {
		t.Fatalf("snapshot: rejected %d, queued %d, bytes %d", s.Counters.RejectedCapacity, s.Queued, s.Bytes)
	}
	mustNotReceive(t, out, "queued requests must still wait")
}

func TestGlobalMaxRequests(t *testing.T) {
	c := newController(t, Config{MaxRequests: 2}, closedGate())
	out := make(chan result, 10)
	enqueueAsync(context.Background(), c, Request{Priority: 0}, out)
	enqueueAsync(context.Background(), c, Request{Priority: 7}, out)
	waitQueued(t, c, 2)
	if _, err := c.Enqueue(context.Background(), Request{Priority: 9}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("err %v, want ErrCapacity", err)
	}
}

func TestTTLExpiry(t *testing.T) {
	clk := newFakeClock()
	c := newController(t, Config{DefaultTTL: time.Minute, Bands: []BandConfig{{Priority: 1, TTL: 10 * time.Second}}}, closedGate(), WithClock(clk))
	out := make(chan result, 10)
	enqueueAsync(context.Background(), c, Request{Priority: 1, FlowID: "short"}, out)
	enqueueAsync(context.Background(), c, Request{Priority: 0, FlowID: "default"}, out)
	waitQueued(t, c, 2)
	clk.Advance(10*time.Second - time.Nanosecond)
	mustNotReceive(t, out, "before the band TTL")
	clk.Advance(time.Nanosecond)
	r := <-out
	if r.req.FlowID != "short" || !errors.Is(r.err, ErrTTL) || r.ticket != nil {
		t.Fatalf("band TTL: %+v, err %v", r.req, r.err)
	}
	if s := c.Snapshot(); s.Queued != 1 || s.Counters.EvictedTTL != 1 {
		t.Fatalf("after expiry: queued %d, expired %d", s.Queued, s.Counters.EvictedTTL)
	}
	clk.Advance(50 * time.Second)
	if r = <-out; r.req.FlowID != "default" || !errors.Is(r.err, ErrTTL) {
		t.Fatalf("default TTL: %+v, err %v", r.req, r.err)
	}
}

func TestCancelRemovesAtOnce(t *testing.T) {
	c := newController(t, Config{}, closedGate())
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan result, 1)
	enqueueAsync(ctx, c, Request{FlowID: "a", Bytes: 7}, out)
	waitQueued(t, c, 1)
	cancel()
	r := <-out
	if !errors.Is(r.err, context.Canceled) || r.ticket != nil {
		t.Fatalf("err %v, ticket %v", r.err, r.ticket)
	}
	// Enqueue has returned, so the request is already gone.
	s := c.Snapshot()
	if s.Queued != 0 || s.Bytes != 0 || len(s.Bands[0].Flows) != 0 || s.Counters.EvictedContextCancelled != 1 {
		t.Fatalf("after cancel: %+v", s)
	}
	// A client already gone is refused without queueing, and counted.
	if _, err := c.Enqueue(ctx, Request{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("dead ctx: %v", err)
	}
	if n := c.Snapshot().Counters.EvictedContextCancelled; n != 2 {
		t.Fatalf("cancelled %d, want 2", n)
	}
}

func TestCloseResolvesEveryWaiter(t *testing.T) {
	big := func(p int) BandConfig { return BandConfig{Priority: p, MaxRequests: 1000} }
	c := newController(t, Config{Bands: []BandConfig{big(-1), big(0), big(1)}}, slots(1))
	held, _ := c.Enqueue(context.Background(), Request{})
	out := make(chan result, 50)
	for i := 0; i < 30; i++ {
		enqueueAsync(context.Background(), c, Request{FlowID: fmt.Sprint(i % 4), Priority: i%3 - 1}, out)
	}
	waitQueued(t, c, 30)
	c.Close()
	for i := 0; i < 30; i++ {
		if r := <-out; !errors.Is(r.err, ErrShutdown) {
			t.Fatalf("waiter %d: err %v, want ErrShutdown", i, r.err)
		}
	}
	if _, err := c.Enqueue(context.Background(), Request{}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("after Close: %v", err)
	}
	if !held.Release() {
		t.Fatal("in-flight ticket not releasable after Close")
	}
	s := c.Snapshot()
	if s.Counters.EvictedOther != 30 || s.Counters.RejectedOther != 1 || s.InFlight.Requests != 0 || s.Queued != 0 {
		t.Fatalf("after Close: %+v", s.Counters)
	}
	c.Close() // idempotent
}

func TestKickDispatchesWhenGateOpens(t *testing.T) {
	lim := &limit{}
	c := newController(t, Config{PollInterval: time.Hour}, lim) // no poller help
	out := make(chan result, 10)
	enqueueAsync(context.Background(), c, Request{Priority: 0}, out)
	waitQueued(t, c, 1)
	enqueueAsync(context.Background(), c, Request{Priority: 5}, out)
	waitQueued(t, c, 2)
	lim.n.Store(1) // the replicas' metrics improved: no event the controller sees
	mustNotReceive(t, out, "dispatched before anyone looked")
	c.Kick()
	r := <-out
	if r.req.Priority != 5 {
		t.Fatalf("first out: priority %d, want 5", r.req.Priority)
	}
	r.ticket.Release()
	if r := <-out; r.req.Priority != 0 {
		t.Fatalf("second out: priority %d", r.req.Priority)
	}
}

// recheckGate is a closed gate that says when to ask again, as a gate
// sharing the pool with other instances does when capacity frees up there.
type recheckGate struct {
	gate
	recheck chan struct{}
}

func (g *recheckGate) Saturation(in InFlight) Verdict {
	v := g.gate.Saturation(in)
	v.Recheck = g.recheck
	return v
}

// The controller asks again as soon as the detector's answer says it may
// have changed, not at the next poll.
func TestRecheckAsksAgain(t *testing.T) {
	g := &recheckGate{recheck: make(chan struct{}, 1)}
	g.closed.Store(true)
	c := newController(t, Config{PollInterval: time.Hour}, g) // no poller help
	out := make(chan result, 1)
	enqueueAsync(context.Background(), c, Request{}, out)
	waitQueued(t, c, 1)
	g.closed.Store(false)
	mustNotReceive(t, out, "dispatched before anyone looked")
	g.recheck <- struct{}{}
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.ticket.Release()
}

func TestPollerDispatchesWhenGateOpens(t *testing.T) {
	g := closedGate()
	c := newController(t, Config{PollInterval: time.Millisecond}, g)
	out := make(chan result, 1)
	enqueueAsync(context.Background(), c, Request{}, out)
	waitQueued(t, c, 1)
	g.closed.Store(false)
	if r := <-out; r.err != nil {
		t.Fatal(r.err)
	}
}

func TestNewArrivalDoesNotOvertakeQueue(t *testing.T) {
	lim := &limit{}
	c := newController(t, Config{PollInterval: time.Hour}, lim)
	out := make(chan result, 10)
	enqueueAsync(context.Background(), c, Request{FlowID: "early"}, out)
	waitQueued(t, c, 1)
	// One slot opens without an event. The next arrival must not take it
	// through the pass-through path: the early request gets it.
	lim.n.Store(1)
	enqueueAsync(context.Background(), c, Request{FlowID: "late"}, out)
	r := <-out
	if r.req.FlowID != "early" || r.ticket == nil {
		t.Fatalf("%+v %v", r.req, r.err)
	}
	waitQueued(t, c, 1) // late waits its turn
	r.ticket.Release()
	if r = <-out; r.req.FlowID != "late" || r.ticket == nil {
		t.Fatalf("%+v %v", r.req, r.err)
	}
}

func TestReconfigureKeepsWaiters(t *testing.T) {
	clk := newFakeClock()
	c := newController(t, Config{Bands: []BandConfig{{Priority: 0, MaxRequests: 10}}}, slots(1), WithClock(clk))
	held, _ := c.Enqueue(context.Background(), Request{})
	out := make(chan result, 10)
	for i := 0; i < 3; i++ {
		enqueueAsync(context.Background(), c, Request{FlowID: "a", Bytes: int64(i)}, out)
		waitQueued(t, c, i+1)
	}
	// Shrink the band below what is queued and switch its ordering.
	err := c.Reconfigure(Config{Bands: []BandConfig{{Priority: 0, MaxRequests: 1, Ordering: "edf", Name: "only"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Snapshot()
	if s.Queued != 3 || s.Bands[0].Name != "only" {
		t.Fatalf("after reload: %+v", s)
	}
	// (Another flow's arrival could push one of "a"'s out only if that made
	// room; with 3 queued over a limit of 1 it does not: refused, nothing evicted.)
	if _, err := c.Enqueue(context.Background(), Request{}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("new limit not applied: %v", err)
	}
	if err := c.Reconfigure(Config{Bands: []BandConfig{{Priority: 0, Fairness: "fifo"}}}, nil); err == nil {
		t.Fatal("bad config accepted")
	}
	got := serveOneByOne(t, held, out, 3)
	for i, r := range got {
		if r.Bytes != int64(i) {
			t.Fatalf("order after reload %+v", got)
		}
	}
	// Deadlines survived the reload: nothing left to expire, counters balance.
	clk.Advance(time.Hour)
	if s := c.Snapshot(); s.Counters.EvictedTTL != 0 || s.Counters.Dispatched != 4 {
		t.Fatalf("%+v", s.Counters)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := New(Config{Bands: []BandConfig{{MaxBytes: -1}}}, &gate{}); err == nil {
		t.Fatal("bad config accepted")
	}
	if _, err := New(Config{}, nil); err == nil {
		t.Fatal("nil detector accepted")
	}
}

func TestFullBandPushesOutTheFloodingTenantNotTheNewcomer(t *testing.T) {
	c := newController(t, Config{Bands: []BandConfig{{Priority: 0, MaxRequests: 4}}}, closedGate())
	flood := make(chan result, 10)
	for i := 0; i < 4; i++ {
		enqueueAsync(context.Background(), c, Request{FlowID: "B"}, flood)
		waitQueued(t, c, i+1)
	}
	// The band is full of B's requests: a B arrival is refused at once...
	if _, err := c.Enqueue(context.Background(), Request{FlowID: "B"}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("flooder's own arrival: %v, want ErrCapacity", err)
	}
	// ...but A's arrival takes the place of B's newest request.
	quiet := make(chan result, 1)
	enqueueAsync(context.Background(), c, Request{FlowID: "A"}, quiet)
	r := <-flood
	if !errors.Is(r.err, ErrCapacity) {
		t.Fatalf("pushed-out request: %v, want ErrCapacity", r.err)
	}
	waitQueued(t, c, 4)
	s := c.Snapshot()
	if s.Counters.RejectedCapacity != 2 {
		t.Fatalf("rejected %d, want 2 (B's arrival and B's newest queued request)", s.Counters.RejectedCapacity)
	}
	// A fair band holds 2 and 2: neither tenant can push the other out now.
	enqueueAsync(context.Background(), c, Request{FlowID: "A"}, quiet)
	if r := <-flood; !errors.Is(r.err, ErrCapacity) {
		t.Fatalf("second push-out: %v", r.err)
	}
	if _, err := c.Enqueue(context.Background(), Request{FlowID: "A"}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("with 2 and 2 queued, A's third must be refused: %v", err)
	}
}
