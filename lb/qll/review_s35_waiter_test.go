package qll

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// blockingWaiter is an lb.Waiter that blocks as the adapter's body read
// does on a stalled upload: until left ends, or until released.
type blockingWaiter struct {
	left    chan context.Context
	release chan struct{}
}

func (w *blockingWaiter) Waiting(left context.Context) {
	w.left <- left
	select {
	case <-left.Done():
	case <-w.release:
	}
}

// A pick whose queue_timeout ends while its Waiter blocks (a body read on
// a stalled upload) is refused at once: left ends. A pick handed a
// replica meanwhile keeps its Waiter's work whole: left never ends.
func TestReviewS35AWaitersContextEndsOnlyWhenItLeavesUnserved(t *testing.T) {
	s := New(Config{Parallelism: 1, QueueTimeout: 20 * time.Millisecond})
	s.SetReplicas([]string{"a:1"})
	t.Cleanup(s.Close)
	held := mustAcquire(t, s)

	w := &blockingWaiter{left: make(chan context.Context, 1), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := s.Pick(context.Background(), &lb.Request{Waiter: w})
		done <- err
	}()
	left := <-w.left
	select {
	case err := <-done:
		if !errors.Is(err, lb.ErrQueueTimeout) {
			t.Fatalf("timed-out pick: %v, want ErrQueueTimeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the timed-out pick waited for its Waiter: left never ended")
	}
	if left.Err() == nil {
		t.Fatal("left not done after the pick timed out")
	}

	// Handed a replica while its Waiter works: left stays open.
	s.Configure(Config{Parallelism: 1, QueueTimeout: time.Hour})
	go func() {
		l, err := s.Pick(context.Background(), &lb.Request{Waiter: w})
		if err == nil {
			l.Release(lb.Outcome{Kind: lb.Success})
		}
		done <- err
	}()
	left = <-w.left
	held.Release(lb.Outcome{Kind: lb.Success}) // the slot goes to the waiter
	waitDispatched(t, s, 2)
	if left.Err() != nil {
		t.Fatalf("left ended for a pick that was handed a replica: %v", left.Err())
	}
	close(w.release)
	if err := <-done; err != nil {
		t.Fatalf("dispatched pick: %v", err)
	}
}

// waitDispatched waits until the state has dispatched n requests.
func waitDispatched(t *testing.T, s *State, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Snapshot().Counters.Dispatched < n {
		if time.Now().After(deadline) {
			t.Fatalf("dispatched %d, want %d", s.Snapshot().Counters.Dispatched, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// cancellingWaiter cancels its pick's context once left ends, as net/http
// does when the cut body read fails on the connection.
type cancellingWaiter struct{ cancel context.CancelFunc }

func (w cancellingWaiter) Waiting(left context.Context) {
	<-left.Done()
	w.cancel()
}

// A pick whose queue_timeout ended keeps that refusal even when its
// context ended next (the cut body read): it is answered as timed out,
// not taken for a client that left (which gets no answer).
func TestReviewS35ATimedOutPickStaysTimedOutWhenItsContextEndsNext(t *testing.T) {
	s := New(Config{Parallelism: 1, QueueTimeout: time.Millisecond})
	s.SetReplicas([]string{"a:1"})
	t.Cleanup(s.Close)
	held := mustAcquire(t, s)
	defer held.Release(lb.Outcome{Kind: lb.Success})
	for i := range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := s.Pick(ctx, &lb.Request{Waiter: cancellingWaiter{cancel}})
		cancel()
		if !errors.Is(err, lb.ErrQueueTimeout) {
			t.Fatalf("pick %d: %v, want ErrQueueTimeout", i, err)
		}
	}
}

// A retry resolved with lb.ErrAllDown (no replica left but those it
// avoids) is asked again by the adapter without its avoid list: its
// Waiter's work (the body read) must not be cut, or the request would go
// on with a truncated body.
func TestReviewS35ARetryAnsweredAllDownKeepsItsWaitersWork(t *testing.T) {
	s := New(Config{Parallelism: 1, QueueTimeout: time.Hour})
	s.SetReplicas([]string{"a:1", "b:1"})
	t.Cleanup(s.Close)
	la, lb1 := mustAcquire(t, s), mustAcquire(t, s)
	defer la.Release(lb.Outcome{Kind: lb.Success})
	defer lb1.Release(lb.Outcome{Kind: lb.Success})

	w := &blockingWaiter{left: make(chan context.Context, 1), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := s.Pick(context.Background(), &lb.Request{Waiter: w, Avoid: []string{"a:1"}})
		done <- err
	}()
	left := <-w.left
	s.SetReplicas([]string{"a:1"}) // only the avoided replica is left
	waitFor := time.Now().Add(10 * time.Second)
	for s.Snapshot().QueueDepth > 0 && time.Now().Before(waitFor) {
		time.Sleep(time.Millisecond)
	}
	if left.Err() != nil {
		t.Fatal("left ended for a retry answered ErrAllDown, which the adapter asks again")
	}
	close(w.release)
	if err := <-done; !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("retry: %v, want ErrAllDown", err)
	}
}
