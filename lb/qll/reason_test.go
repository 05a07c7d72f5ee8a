package qll

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// A pick that finds a free replica says least_latency; one that waited
// in the queue for a slot says queued.
func TestPickSaysWhetherTheRequestQueued(t *testing.T) {
	s := New(oneAtATime)
	s.SetReplicas([]string{"a:1"})
	first := &lb.Request{}
	held := mustPick(t, s, first)
	if first.Reason != lb.ReasonLeastLatency {
		t.Fatalf("reason %q for a pick on a free replica, want %q", first.Reason, lb.ReasonLeastLatency)
	}
	second := &lb.Request{}
	w := pickQueued(t, s, second)
	held.Release(success(time.Millisecond))
	r := await(t, w, "the queued request")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.lease.Release(success(time.Millisecond))
	if second.Reason != lb.ReasonQueued {
		t.Fatalf("reason %q for a request that waited in the queue, want %q", second.Reason, lb.ReasonQueued)
	}
}
