package tracker

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// AcquireUsable checks and counts at once: a down replica takes nothing,
// and once its down time is over exactly one of many concurrent callers
// gets the probe; the others get nil, and after a good probe every one
// gets a lease again. A healthy replica takes every caller.
func TestAcquireUsableLetsOneProbeThroughUnderConcurrency(t *testing.T) {
	var nowNanos atomic.Int64
	tr := New(Config{FailDuration: 10 * time.Second})
	tr.now = func() time.Time { return time.Unix(0, nowNanos.Load()) }
	tr.SetReplicas([]string{"a:1"})
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure})
	if l := tr.AcquireUsable("a:1", 1); l != nil {
		t.Fatal("a down replica took a request")
	}
	nowNanos.Store(int64(11 * time.Second))

	const callers = 32
	race := func() []*Lease {
		var wg sync.WaitGroup
		start := make(chan struct{})
		got := make(chan *Lease, callers)
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if l := tr.AcquireUsable("a:1", 1); l != nil {
					got <- l
				}
			}()
		}
		close(start)
		wg.Wait()
		close(got)
		var out []*Lease
		for l := range got {
			out = append(out, l)
		}
		return out
	}
	probes := race()
	if len(probes) != 1 {
		t.Fatalf("%d concurrent probes of a replica whose down time is over; want 1", len(probes))
	}
	probes[0].Release(lb.Outcome{Kind: lb.Success})
	up := race()
	if len(up) != callers {
		t.Fatalf("after a good probe %d of %d callers got a lease", len(up), callers)
	}
	for _, l := range up {
		l.Release(lb.Outcome{Kind: lb.Success})
	}
	if n := tr.InFlight(); n != 0 {
		t.Fatalf("in flight after every release: %d", n)
	}
	tr.SetReplicas(nil)
	if tr.AcquireUsable("a:1", 1) != nil {
		t.Fatal("a removed replica took a request")
	}
}
