package flow

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// Request.Queued runs once for a request that waits, and never for one
// that passes straight through or is refused at once: the adapter reads
// the body there, which only a waiting request needs.
func TestQueuedHookRunsOnlyForWaitingRequests(t *testing.T) {
	c := newController(t, Config{Bands: []BandConfig{{Priority: 0, MaxRequests: 1}}}, slots(1))
	var calls atomic.Int64
	hook := func(context.Context) { calls.Add(1) }
	held, err := c.Enqueue(context.Background(), Request{Queued: hook})
	if err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("passed straight through: hook ran %d times, want 0", n)
	}
	out := make(chan result, 1)
	enqueueAsync(context.Background(), c, Request{Queued: hook}, out)
	waitQueued(t, c, 1)
	if _, err := c.Enqueue(context.Background(), Request{Queued: hook}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("over the band limit: %v, want ErrCapacity", err)
	}
	held.Release()
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.ticket.Release()
	if n := calls.Load(); n != 1 {
		t.Fatalf("hook ran %d times, want once (for the queued request only)", n)
	}
}
