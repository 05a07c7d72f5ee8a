package flow

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Queued hook blocks (the adapter reads the client's body there).
// Its context ends as soon as the request leaves the queue without being
// dispatched, so the hook can stop and the refusal reach the client; it
// never ends for a request that is dispatched, whose hook finishes its
// work. Without it a refused request's Enqueue waited for the hook: for a
// stalled upload, for ever.

// blockingHook is a Queued hook that sends its context on lefts and
// returns once it is done or unblock is closed.
func blockingHook(lefts chan<- context.Context, unblock <-chan struct{}) func(context.Context) {
	return func(left context.Context) {
		lefts <- left
		select {
		case <-left.Done():
		case <-unblock:
		}
	}
}

// receiveResult waits for an Enqueue that must return; the bound only
// keeps a broken build from hanging.
func receiveResult(t *testing.T, out <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-out:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Enqueue did not return while its hook waited", what)
		return result{}
	}
}

func TestQueuedHookContextEndsWhenPushedOutNotWhenDispatched(t *testing.T) {
	c := newController(t, Config{Bands: []BandConfig{{Priority: 0, MaxRequests: 2}}}, slots(1))
	held, err := c.Enqueue(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	lefts, unblock := make(chan context.Context, 3), make(chan struct{})
	hook := blockingHook(lefts, unblock)
	out, victim := make(chan result, 2), make(chan result, 1)
	enqueueAsync(context.Background(), c, Request{FlowID: "flood", Bytes: 10, Queued: hook}, out)
	older := <-lefts
	enqueueAsync(context.Background(), c, Request{FlowID: "flood", Bytes: 20, Queued: hook}, victim)
	newest := <-lefts
	// The band is full: the quiet flow's request pushes out the flood's newest.
	enqueueAsync(context.Background(), c, Request{FlowID: "quiet", Bytes: 5, Queued: hook}, out)
	quiet := <-lefts

	r := receiveResult(t, victim, "pushed out")
	if !errors.Is(r.err, ErrCapacity) || r.ticket != nil || newest.Err() == nil {
		t.Fatalf("pushed out: err %v, ticket %v, its hook's context %v; want ErrCapacity and the context done", r.err, r.ticket, newest.Err())
	}
	if s := c.Snapshot(); s.Queued != 2 || s.Bytes != 15 || s.Counters.RejectedCapacity != 1 {
		t.Fatalf("after the push-out: queued %d, bytes %d, counters %+v", s.Queued, s.Bytes, s.Counters)
	}

	// One slot: one of the two is dispatched while its hook still runs.
	held.Release()
	eventually(t, "a dispatch", func() bool { return c.Snapshot().Counters.Dispatched == 2 })
	if older.Err() != nil || quiet.Err() != nil {
		t.Fatalf("a waiting or dispatched request's hook context ended: %v, %v", older.Err(), quiet.Err())
	}
	close(unblock)
	first := receiveResult(t, out, "dispatched")
	if first.err != nil {
		t.Fatal(first.err)
	}
	first.ticket.Release()
	second := receiveResult(t, out, "dispatched next")
	if second.err != nil {
		t.Fatal(second.err)
	}
	second.ticket.Release()
	if older.Err() != nil || quiet.Err() != nil {
		t.Fatalf("a dispatched request's hook context ended: %v, %v", older.Err(), quiet.Err())
	}
	if s := c.Snapshot(); s.Queued != 0 || s.Bytes != 0 || s.InFlight != (InFlight{}) || s.Counters.Dispatched != 3 {
		t.Fatalf("left over: queued %d, bytes %d, in flight %+v, counters %+v", s.Queued, s.Bytes, s.InFlight, s.Counters)
	}
}

func TestQueuedHookContextEndsAtExpiryAndClose(t *testing.T) {
	clk := newFakeClock()
	c := newController(t, Config{DefaultTTL: time.Minute}, closedGate(), WithClock(clk))
	lefts := make(chan context.Context, 1)
	hook := blockingHook(lefts, nil)
	out := make(chan result, 1)

	enqueueAsync(context.Background(), c, Request{Bytes: 7, Queued: hook}, out)
	left := <-lefts
	clk.Advance(time.Minute)
	if r := receiveResult(t, out, "expired"); !errors.Is(r.err, ErrTTL) || left.Err() == nil {
		t.Fatalf("expired: err %v, its hook's context %v; want ErrTTL and the context done", r.err, left.Err())
	}
	if s := c.Snapshot(); s.Queued != 0 || s.Bytes != 0 || s.Counters.EvictedTTL != 1 {
		t.Fatalf("after the expiry: queued %d, bytes %d, counters %+v", s.Queued, s.Bytes, s.Counters)
	}

	enqueueAsync(context.Background(), c, Request{Bytes: 7, Queued: hook}, out)
	left = <-lefts
	c.Close()
	if r := receiveResult(t, out, "closed"); !errors.Is(r.err, ErrShutdown) || left.Err() == nil {
		t.Fatalf("closed: err %v, its hook's context %v; want ErrShutdown and the context done", r.err, left.Err())
	}
	if s := c.Snapshot(); s.Queued != 0 || s.Bytes != 0 || s.Counters.EvictedOther != 1 {
		t.Fatalf("after Close: queued %d, bytes %d, counters %+v", s.Queued, s.Bytes, s.Counters)
	}
}
