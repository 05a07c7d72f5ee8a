package redisleast

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// Close while a request is queued and its body is still being read (the
// window between the queueing script's reply and the wait for a slot):
// Close must wait for the request to leave the queue before the store's
// connection closes. Before, the request found the store closing only in
// await, after the read, and left the queue over a connection Close had
// closed meanwhile: its records stayed in Redis, and the next freed slot
// was handed to them (with one instance, for good).
func TestCloseDuringAQueuedReadLeavesNothingQueued(t *testing.T) {
	addr := redistest.Addr(t)
	s := newStore(t, queueConfig(t, addr), "p") // queue_timeout 20 s
	c := rawFor(t, single(addr))
	if err := s.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, s, "r")
	closed := make(chan struct{})
	l, err := s.Pick(context.Background(), &lb.Request{Waiter: waiterFunc(func(left context.Context) {
		go func() { s.Close(); close(closed) }()
		<-left.Done() // Close cuts the read
		// A read takes a moment to stop (the adapter's deadline, the
		// bytes in flight): the request leaves the queue after it.
		time.Sleep(200 * time.Millisecond)
	})})
	if l != nil || !errors.Is(err, lb.ErrShutdown) {
		t.Fatalf("pick queued at Close: lease on %q, err %v; want lb.ErrShutdown", replicaOf(l), err)
	}
	<-closed
	held.Release(ok)
	if !queueEmpty(t, s, c) {
		t.Fatalf("the request refused at Close is still queued: queue %d, waiters %d, assigned %d",
			llen(t, c, s.k.queue), hlen(t, c, s.k.waiters), hlen(t, c, s.k.assigned))
	}
}
