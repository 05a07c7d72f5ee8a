package qll

import (
	"sync"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// proxyView is the proxy's health view as a test sets it.
type proxyView struct {
	mu                sync.Mutex
	unavailable, full []string
}

func (v *proxyView) set(unavailable, full []string) {
	v.mu.Lock()
	v.unavailable, v.full = unavailable, full
	v.mu.Unlock()
}

func (v *proxyView) read() ([]string, []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.unavailable, v.full
}

// TestWaitersSeeADownReplicaComeBack: a request waits because one
// replica is busy and the proxy has the other down; when the proxy's
// view clears it, the request goes there, without waiting for a release
// or a new request to bring the view.
func TestWaitersSeeADownReplicaComeBack(t *testing.T) {
	s := New(oneAtATime)
	defer s.Close()
	s.SetReplicas([]string{"a:1", "b:1"})
	view := &proxyView{}
	s.SetProxyView(view.read)

	busy := mustPick(t, s, &lb.Request{Unavailable: []string{"b:1"}})
	if busy.Replica() != "a:1" {
		t.Fatalf("picked %s while b:1 is down", busy.Replica())
	}
	view.set([]string{"b:1"}, nil)
	w := pickQueued(t, s, &lb.Request{Unavailable: []string{"b:1"}})

	view.set(nil, nil) // b:1's health check passes again
	r := await(t, w, "the waiter, after b:1 came back")
	if r.err != nil || r.lease.Replica() != "b:1" {
		t.Fatalf("waiter: %v on %v, want a lease on b:1", r.err, r.lease)
	}
	r.lease.Release(success(1))
	busy.Release(success(1))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight %d after all releases", n)
	}
}

// TestWaitersFailWhenTheProxyTakesEveryReplicaDown: the view taking the
// last usable replica down fails the waiting requests at once, as a new
// request bringing that view would.
func TestWaitersFailWhenTheProxyTakesEveryReplicaDown(t *testing.T) {
	s := New(oneAtATime)
	defer s.Close()
	s.SetReplicas([]string{"a:1", "b:1"})
	view := &proxyView{}
	s.SetProxyView(view.read)
	busy := mustPick(t, s, &lb.Request{Unavailable: []string{"b:1"}})
	w := pickQueued(t, s, &lb.Request{Unavailable: []string{"b:1"}})

	view.set([]string{"a:1", "b:1"}, nil)
	if r := await(t, w, "the waiter, every replica down"); r.err != lb.ErrAllDown {
		t.Fatalf("waiter: %v on %v, want lb.ErrAllDown", r.err, r.lease)
	}
	busy.Release(success(1))
}
