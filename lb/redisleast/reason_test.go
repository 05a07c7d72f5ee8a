package redisleast

import (
	"context"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// A pick that gets a free slot at once is global_least; one the global
// queue hands a slot to is queued.
func TestPickSaysGlobalLeastOrQueued(t *testing.T) {
	addr := testRedis(t)
	c := raw(t, addr)
	s := newStore(t, queueConfig(t, addr), "reason")
	s.SetReplicas([]string{"r:1"})
	first := &lb.Request{}
	held, err := s.Pick(context.Background(), first)
	if err != nil {
		t.Fatal(err)
	}
	if first.Reason != lb.ReasonGlobalLeast {
		t.Fatalf("a free slot: reason %q, want %q", first.Reason, lb.ReasonGlobalLeast)
	}
	second := &lb.Request{}
	out := make(chan error, 1)
	var l lb.Lease
	go func() {
		var err error
		l, err = s.Pick(context.Background(), second)
		out <- err
	}()
	waitFor(t, "the second pick to queue", func() bool { return hlen(t, c, s.k.waiters) == 1 })
	held.Release(lb.Outcome{Kind: lb.Success})
	if err := <-out; err != nil {
		t.Fatal(err)
	}
	l.Release(lb.Outcome{Kind: lb.Success})
	if second.Reason != lb.ReasonQueued {
		t.Fatalf("a slot handed by the queue: reason %q, want %q", second.Reason, lb.ReasonQueued)
	}
}
