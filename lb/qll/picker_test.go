package qll

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// pickQueued starts a Pick for req and returns once it waits in the queue.
func pickQueued(t *testing.T, s *State, req *lb.Request) <-chan result {
	t.Helper()
	out := make(chan result, 1)
	depth := s.Snapshot().QueueDepth
	go func() {
		l, err := s.Pick(context.Background(), req)
		r := result{err: err}
		if l != nil {
			r.lease = l.(*Lease)
		}
		out <- r
	}()
	waitFor(t, "the pick to queue", func() bool { return s.Snapshot().QueueDepth > depth })
	return out
}

// await returns the waiter's result; the bound only keeps a broken test
// from hanging.
func await(t *testing.T, w <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-w:
		return r
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: still waiting", what)
		return result{}
	}
}

func pending(w <-chan result) bool {
	select {
	case r := <-w:
		if r.lease != nil {
			r.lease.Release(lb.Outcome{Kind: lb.Cancelled})
		}
		return false
	default:
		return true
	}
}

// oneAtATime: a busy replica never takes another request, so the queue
// is used whenever every available replica is busy.
var oneAtATime = Config{Parallelism: 1} // free slots only (adaptive mode), one each

func mustPick(t *testing.T, s *State, req *lb.Request) *Lease {
	t.Helper()
	l, err := s.Pick(context.Background(), req)
	if err != nil {
		t.Fatalf("Pick(unavailable %v): %v", req.Unavailable, err)
	}
	return l.(*Lease)
}

func TestPickNeverDispatchesToAnUnavailableReplica(t *testing.T) {
	s := New(oneAtATime)
	s.SetReplicas([]string{"a:1", "b:1", "c:1"})
	for i := 0; i < 12; i++ {
		l := mustPick(t, s, &lb.Request{Unavailable: []string{"a:1", "unknown:1"}})
		if l.Replica() == "a:1" {
			t.Fatalf("pick %d went to a:1, which the proxy reports unavailable", i)
		}
		l.Release(success(time.Millisecond))
	}
}

// A waiting request is not dispatched to a replica the latest request
// reported unavailable, even when that replica frees up; it goes to the
// next available one, in FIFO order.
func TestUnavailableHoldsBackWaitingRequests(t *testing.T) {
	s := New(oneAtATime)
	s.SetReplicas([]string{"a:1", "b:1"})
	x := mustPick(t, s, &lb.Request{})
	y := mustPick(t, s, &lb.Request{})
	first := pickQueued(t, s, &lb.Request{})
	second := pickQueued(t, s, &lb.Request{Unavailable: []string{x.Replica()}})

	x.Release(success(time.Millisecond))
	if !pending(first) || !pending(second) {
		t.Fatalf("a waiting request was dispatched to %s, reported unavailable", x.Replica())
	}
	if d := s.Snapshot().QueueDepth; d != 2 {
		t.Fatalf("queue depth %d, want 2", d)
	}
	y.Release(success(time.Millisecond))
	r := await(t, first, "the oldest waiter")
	if r.err != nil || r.lease.Replica() != y.Replica() {
		t.Fatalf("oldest waiter: %v on %v, want a lease on %s", r.err, r.lease, y.Replica())
	}
	if !pending(second) {
		t.Fatal("the second waiter was dispatched while no available replica was free")
	}
	r.lease.Release(success(time.Millisecond))
	r = await(t, second, "the second waiter")
	if r.err != nil || r.lease.Replica() != y.Replica() {
		t.Fatalf("second waiter: %v on %v, want a lease on %s", r.err, r.lease, y.Replica())
	}
	r.lease.Release(success(time.Millisecond))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight %d after all releases", n)
	}
}

// A later request that reports the replica available again hands it to
// the requests waiting, oldest first, before itself.
func TestAvailableAgainTakesTheWaitingRequests(t *testing.T) {
	s := New(oneAtATime)
	s.SetReplicas([]string{"a:1", "b:1"})
	x := mustPick(t, s, &lb.Request{})
	y := mustPick(t, s, &lb.Request{})
	waiting := pickQueued(t, s, &lb.Request{Unavailable: []string{x.Replica()}})
	x.Release(success(time.Millisecond))
	if !pending(waiting) {
		t.Fatal("dispatched to an unavailable replica")
	}
	// A later request clears the flag: the waiter takes x, the later
	// request queues behind it.
	later := make(chan result, 1)
	go func() {
		l, err := s.Pick(context.Background(), &lb.Request{})
		r := result{err: err}
		if l != nil {
			r.lease = l.(*Lease)
		}
		later <- r
	}()
	r := await(t, waiting, "the waiter")
	waitFor(t, "the later request to queue", func() bool { return s.Snapshot().QueueDepth == 1 })
	if r.err != nil || r.lease.Replica() != x.Replica() {
		t.Fatalf("waiter: %v on %v, want a lease on %s", r.err, r.lease, x.Replica())
	}
	if !pending(later) {
		t.Fatal("the later request overtook the waiting one")
	}
	r.lease.Release(success(time.Millisecond))
	r = await(t, later, "the later request")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.lease.Release(success(time.Millisecond))
	y.Release(success(time.Millisecond))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight %d after all releases", n)
	}
}

// Every present replica unavailable: the request fails at once, and so do
// the requests already waiting (only a later request could clear the view;
// without one they would wait out queue_timeout).
func TestEveryReplicaUnavailableFailsFastAndFailsTheWaiters(t *testing.T) {
	s := New(oneAtATime)
	s.SetReplicas([]string{"a:1", "b:1"})
	x := mustPick(t, s, &lb.Request{})
	y := mustPick(t, s, &lb.Request{})
	waiting := pickQueued(t, s, &lb.Request{})

	_, err := s.Pick(context.Background(), &lb.Request{Unavailable: []string{"a:1", "b:1"}})
	if !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("every replica unavailable: %v, want lb.ErrAllDown", err)
	}
	if r := await(t, waiting, "the waiter"); !errors.Is(r.err, lb.ErrAllDown) {
		t.Fatalf("waiter: %v (lease %v), want lb.ErrAllDown", r.err, r.lease)
	}
	snap := s.Snapshot()
	if snap.QueueDepth != 0 || snap.Counters.Refused != 2 {
		t.Fatalf("depth %d, counters %+v: want an empty queue and 2 refused", snap.QueueDepth, snap.Counters)
	}
	x.Release(success(time.Millisecond))
	y.Release(success(time.Millisecond))
	mustPick(t, s, &lb.Request{}).Release(success(time.Millisecond))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight %d after all releases", n)
	}
}

// A set-backends that leaves only replicas the proxy reported unavailable
// fails the waiting requests too.
func TestSetReplicasLeavingOnlyUnavailableFailsTheWaiters(t *testing.T) {
	s := New(oneAtATime)
	s.SetReplicas([]string{"a:1", "b:1"})
	x := mustPick(t, s, &lb.Request{})
	y := mustPick(t, s, &lb.Request{})
	waiting := pickQueued(t, s, &lb.Request{Unavailable: []string{x.Replica()}})
	s.SetReplicas([]string{x.Replica()})
	if r := await(t, waiting, "the waiter"); !errors.Is(r.err, lb.ErrAllDown) {
		t.Fatalf("waiter: %v (lease %v), want lb.ErrAllDown", r.err, r.lease)
	}
	x.Release(success(time.Millisecond))
	y.Release(success(time.Millisecond))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight %d after all releases", n)
	}
}

// A replica flagged unavailable, removed while draining and added back,
// comes back without the stale flag: requests that report no replica
// unavailable use it.
func TestReaddedReplicaForgetsItsUnavailableFlag(t *testing.T) {
	s := New(oneAtATime)
	s.SetReplicas([]string{"a:1", "b:1"})
	x := mustPick(t, s, &lb.Request{Unavailable: []string{"b:1"}}) // a:1, and flags b:1
	y := mustPick(t, s, &lb.Request{})                             // b:1, clears the flag
	if x.Replica() != "a:1" || y.Replica() != "b:1" {
		t.Fatalf("picks went to %s and %s", x.Replica(), y.Replica())
	}
	x.Release(success(time.Millisecond))
	// Flag b:1, remove it (it drains: y is out), clear the view, add it back.
	mustPick(t, s, &lb.Request{Unavailable: []string{"b:1"}}).Release(success(time.Millisecond))
	s.SetReplicas([]string{"a:1"})
	mustPick(t, s, &lb.Request{}).Release(success(time.Millisecond))
	s.SetReplicas([]string{"a:1", "b:1"})
	y.Release(success(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	held := map[string]bool{}
	for i := 0; i < 2; i++ {
		l, err := s.Pick(ctx, &lb.Request{})
		if err != nil {
			t.Fatalf("pick %d with both replicas idle and none reported unavailable: %v", i, err)
		}
		held[l.Replica()] = true
		defer l.Release(success(time.Millisecond))
	}
	if !held["b:1"] {
		t.Fatalf("b:1 never picked: %v", held)
	}
}

// Replicas at the proxy's request limit (req.Full) are busy, not down: a
// request that finds every replica full waits, and a release on a full
// replica (its count just dropped) hands it the oldest waiter. Only a
// replica down in the proxy's view, not merely full, makes "all down".
func TestFullReplicasAreBusyNotDown(t *testing.T) {
	s := New(Config{}) // adaptive: free slots grow, so only the flags hold requests back
	s.SetReplicas([]string{"a:1", "b:1"})
	x := mustPick(t, s, &lb.Request{})
	y := mustPick(t, s, &lb.Request{})
	both := []string{"a:1", "b:1"}
	first := pickQueued(t, s, &lb.Request{Unavailable: both, Full: both})
	second := pickQueued(t, s, &lb.Request{Unavailable: both, Full: both})

	x.Release(success(time.Millisecond))
	r := await(t, first, "the oldest waiter")
	if r.err != nil || r.lease.Replica() != x.Replica() {
		t.Fatalf("oldest waiter: %v on %v, want a lease on %s, which just freed", r.err, r.lease, x.Replica())
	}
	if !pending(second) {
		t.Fatalf("the second waiter went to %s, still full", y.Replica())
	}
	y.Release(success(time.Millisecond))
	r2 := await(t, second, "the second waiter")
	if r2.err != nil || r2.lease.Replica() != y.Replica() {
		t.Fatalf("second waiter: %v on %v, want a lease on %s", r2.err, r2.lease, y.Replica())
	}

	// One full, one down: still busy, so the request waits for the full one.
	third := pickQueued(t, s, &lb.Request{Unavailable: both, Full: []string{x.Replica()}})
	r.lease.Release(success(time.Millisecond))
	r3 := await(t, third, "the third waiter")
	if r3.err != nil || r3.lease.Replica() != x.Replica() {
		t.Fatalf("third waiter: %v on %v, want a lease on %s", r3.err, r3.lease, x.Replica())
	}
	// Both down (health), none merely full: fails fast.
	if _, err := s.Pick(context.Background(), &lb.Request{Unavailable: both}); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("every replica down: %v, want lb.ErrAllDown", err)
	}
	r2.lease.Release(success(time.Millisecond))
	r3.lease.Release(success(time.Millisecond))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight %d after all releases", n)
	}
}
