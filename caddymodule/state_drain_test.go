package caddymodule

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// heldPicker reports held requests in flight; it is never asked to pick.
type heldPicker struct{ held atomic.Int64 }

func (p *heldPicker) SetReplicas([]string) {}
func (p *heldPicker) InFlight() map[string]int {
	return map[string]int{"10.0.0.1:8000": int(p.held.Load())}
}
func (p *heldPicker) Pick(context.Context, *lb.Request) (lb.Lease, error) {
	return nil, lb.ErrNoBackends
}

// A state no config uses any more is destroyed at once when it holds no
// request, and otherwise only once its requests (in flight, or still in
// a Select, e.g. queued) have ended.
func TestStateIsDestroyedOnceItsRequestsEnded(t *testing.T) {
	build := func() (*policyState, *heldPicker, <-chan struct{}) {
		pk := &heldPicker{}
		closed := make(chan struct{})
		st := newPolicyState(stateKey{module: "test", pool: "drain-test"}, pk,
			policyParts{settings: func() any { return nil }, closer: func() { close(closed) }})
		return st, pk, closed
	}
	destroyed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	awaitDestroyed := func(what string, c <-chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(5 * time.Second): // a liveness bound, not a timing assertion
			t.Fatalf("%s: the state was never destroyed", what)
		}
	}

	st, _, closed := build()
	st.Destruct()
	if !destroyed(closed) {
		t.Fatal("an idle state was not destroyed at once")
	}

	st, pk, closed := build()
	pk.held.Store(1)
	st.requests.enter() // and one request still in Select
	st.Destruct()
	if destroyed(closed) {
		t.Fatal("destroyed while it held requests")
	}
	pk.held.Store(0)
	if destroyed(closed) {
		t.Fatal("destroyed while a request was still in Select")
	}
	st.requests.leave()
	awaitDestroyed("after its requests ended", closed)
}
