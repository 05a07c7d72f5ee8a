package flow

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// A band that is full only because nothing has dispatched since the gate
// opened (a replica's metrics improved, which no event tells the
// controller) must not refuse an arrival: the requests ahead of it go
// first, and then it fits. Before, the limit was checked against the
// stale queue and the arrival got 429 until the next poll.
func TestArrivalDispatchesBeforeCheckingTheBandLimit(t *testing.T) {
	lim := &limit{}
	lim.n.Store(1)
	c := newController(t, Config{PollInterval: time.Hour, Bands: []BandConfig{{Priority: 0, MaxRequests: 1}}}, lim)
	held, err := c.Enqueue(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	out := make(chan result, 1)
	enqueueAsync(context.Background(), c, Request{FlowID: "a"}, out)
	waitQueued(t, c, 1)
	lim.n.Store(3) // room for two more, unannounced
	tk, err := c.Enqueue(context.Background(), Request{FlowID: "b"})
	if err != nil {
		t.Fatalf("arrival at a band that the open gate empties: %v, want dispatched", err)
	}
	tk.Release()
	r := <-out
	if r.err != nil {
		t.Fatalf("the waiter ahead: %v, want dispatched", r.err)
	}
	r.ticket.Release()
}

// lagClock is a clock whose timers fire only when the test fires them:
// time can pass its deadlines while the expiry callback has not run yet,
// as when time.AfterFunc's goroutine waits for the controller's lock.
type lagClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

func (c *lagClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *lagClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: &fakeClock{}, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (c *lagClock) set(at time.Time) {
	c.mu.Lock()
	c.now = at
	c.mu.Unlock()
}

// fire runs the callbacks of the timers not stopped.
func (c *lagClock) fire() {
	c.mu.Lock()
	ts := c.timers
	c.timers = nil
	c.mu.Unlock()
	for _, t := range ts {
		if t.Stop() {
			t.f()
		}
	}
}

// A request whose TTL has run out is not dispatched, even if the slot
// frees before its expiry callback has run: it waited its whole TTL and
// gets ErrTTL, and the slot goes to the next request that has not.
func TestExpiredRequestIsNotDispatched(t *testing.T) {
	clk := &lagClock{now: t0}
	c := newController(t, Config{PollInterval: time.Hour}, slots(1), WithClock(clk))
	held, err := c.Enqueue(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 2)
	enqueueAsync(context.Background(), c, Request{FlowID: "old", TTL: time.Second}, out)
	waitQueued(t, c, 1)
	enqueueAsync(context.Background(), c, Request{FlowID: "new", TTL: time.Hour}, out)
	waitQueued(t, c, 2)
	clk.set(t0.Add(2 * time.Second)) // "old" is past its deadline; its timer has not run
	held.Release()
	// One release resolves both; their answers come in either order.
	got := map[string]result{}
	for range 2 {
		r := <-out
		if r.ticket != nil {
			r.ticket.Release() // frees the one slot for the other, fix or not
		}
		got[r.req.FlowID] = r
	}
	if old := got["old"]; !errors.Is(old.err, ErrTTL) || old.ticket != nil {
		t.Fatalf("request past its TTL: ticket %v, err %v; want ErrTTL, no ticket", old.ticket != nil, old.err)
	}
	if nw := got["new"]; nw.err != nil || nw.ticket == nil {
		t.Fatalf("next request: err %v; want dispatched", nw.err)
	}
	clk.fire() // the late callback finds the request resolved
	s := c.Snapshot()
	if s.Counters.EvictedTTL != 1 || s.Counters.Dispatched != 2 || s.Queued != 0 || s.InFlight != (InFlight{}) {
		t.Fatalf("counters %+v, queued %d, in flight %+v", s.Counters, s.Queued, s.InFlight)
	}
}

// The demand feed follows every change, Close included: the requests it
// resolves are no longer queued.
func TestCloseClearsTheQueuedDemand(t *testing.T) {
	feed := NewDemandFeed()
	c := newController(t, Config{PollInterval: time.Hour}, closedGate(), PublishDemand(feed))
	out := make(chan result, 2)
	enqueueAsync(context.Background(), c, Request{FlowID: "a", Tokens: 5}, out)
	enqueueAsync(context.Background(), c, Request{FlowID: "b", Tokens: 7}, out)
	waitQueued(t, c, 2)
	c.Close()
	for range 2 {
		if r := <-out; !errors.Is(r.err, ErrShutdown) {
			t.Fatalf("queued at Close: %v, want ErrShutdown", r.err)
		}
	}
	if _, queued := feed.Totals(); queued != (InFlight{}) {
		t.Fatalf("feed after Close: queued %+v, want none", queued)
	}
}

// An arrival that lets waiters in before it is refused publishes the
// change: the demand feed must not go on counting them as queued.
func TestRefusedArrivalPublishesWhatItDispatched(t *testing.T) {
	feed := NewDemandFeed()
	lim := &limit{}
	lim.n.Store(1)
	c := newController(t, Config{PollInterval: time.Hour}, lim, PublishDemand(feed))
	held, err := c.Enqueue(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	out := make(chan result, 3)
	for range 3 {
		enqueueAsync(context.Background(), c, Request{FlowID: "a"}, out)
	}
	waitQueued(t, c, 3)
	// A reload lowers the band's limit under the three waiters.
	if err := c.Reconfigure(Config{PollInterval: time.Hour, Bands: []BandConfig{{Priority: 0, MaxRequests: 1}}}, nil); err != nil {
		t.Fatal(err)
	}
	lim.n.Store(2) // room for one, unannounced
	if _, err := c.Enqueue(context.Background(), Request{FlowID: "a"}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("arrival at a band still over its limit: %v, want ErrCapacity", err)
	}
	r := <-out
	if r.err != nil {
		t.Fatalf("the first waiter: %v, want dispatched", r.err)
	}
	defer r.ticket.Release()
	in, queued := feed.Totals()
	if in.Requests != 2 || queued.Requests != 2 {
		t.Fatalf("feed: in flight %d, queued %d; want 2 and 2", in.Requests, queued.Requests)
	}
}

// A Queued hook that panics must not strand its request: left queued, it
// was later dispatched with a ticket nobody held, and the pool ran one
// slot short for good.
func TestPanickingQueuedHookGivesItsPlaceBack(t *testing.T) {
	for _, dispatchedFirst := range []bool{false, true} {
		c := newController(t, Config{PollInterval: time.Hour}, slots(1))
		held, err := c.Enqueue(context.Background(), Request{})
		if err != nil {
			t.Fatal(err)
		}
		hook := func(context.Context) {
			if dispatchedFirst {
				held.Release() // the slot frees while the hook runs
			}
			panic("hook")
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the hook's panic did not reach the caller")
				}
			}()
			_, _ = c.Enqueue(context.Background(), Request{FlowID: "a", Queued: hook})
		}()
		held.Release()
		s := c.Snapshot()
		n := s.Counters
		if s.Queued != 0 || s.InFlight != (InFlight{}) || n.Released != n.Dispatched {
			t.Fatalf("dispatched while the hook ran %v: queued %d, in flight %+v, counters %+v", dispatchedFirst, s.Queued, s.InFlight, n)
		}
	}
}
