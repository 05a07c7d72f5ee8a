package tracker

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

func TestViewIsLoadActiveTurnAndPaceInOneRead(t *testing.T) {
	now := time.Unix(100, 0)
	tr := New(Config{})
	tr.now = func() time.Time { return now }
	tr.SetReplicas([]string{"a:1", "b:1"})
	old := tr.AcquireCost("a:1", 500)
	now = now.Add(time.Minute)
	tr.AcquireCost("b:1", 7)
	tr.AcquireCost("a:1", 40)
	a, okA := tr.View("a:1", now.Add(-30*time.Second))
	b, okB := tr.View("b:1", now.Add(-30*time.Second))
	if !okA || !okB {
		t.Fatal("present replicas have a view")
	}
	if a.InFlight != 2 || !a.Usable || a.Active != 1 || a.ActiveCost != 40 {
		t.Fatalf("a: %+v, want 2 in flight, usable, 1 active (cost 40) after the cutoff", a)
	}
	if b.InFlight != 1 || b.Active != 1 || b.ActiveCost != 7 {
		t.Fatalf("b: %+v", b)
	}
	if !(b.LastAcquired < a.LastAcquired) {
		t.Fatalf("b got its request before a's latest: LastAcquired b %d, a %d", b.LastAcquired, a.LastAcquired)
	}
	if n, usable := tr.Load("a:1"); n != a.InFlight || usable != a.Usable {
		t.Fatalf("Load says %d %t, View %d %t", n, usable, a.InFlight, a.Usable)
	}
	if _, ok := tr.View("c:1", now); ok {
		t.Fatal("an unknown replica has no view")
	}
	tr.SetReplicas([]string{"b:1"})
	if _, ok := tr.View("a:1", now); ok {
		t.Fatal("a removed replica (still draining) is not a candidate")
	}
	old.Release(lb.Outcome{Kind: lb.Failure})
}

func TestViewOfADownReplicaIsNotUsable(t *testing.T) {
	now := time.Unix(100, 0)
	tr := New(Config{MaxFails: 1, FailDuration: 10 * time.Second})
	tr.now = func() time.Time { return now }
	tr.SetReplicas([]string{"a:1"})
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure})
	if v, _ := tr.View("a:1", time.Time{}); v.Usable {
		t.Fatal("a replica marked down is not usable")
	}
	now = now.Add(11 * time.Second)
	if v, _ := tr.View("a:1", time.Time{}); !v.Usable {
		t.Fatal("its down time over and idle, it takes a probe")
	}
}

// Pace is the EWMA of a replica's time to last byte per unit of cost,
// fed by successes only: a failure's or a cancel's duration says nothing
// about the replica's speed.
func TestPaceFollowsSuccessesPerUnitOfCost(t *testing.T) {
	tr := New(Config{MaxFails: 100})
	tr.SetReplicas([]string{"a:1"})
	pace := func() float64 { v, _ := tr.View("a:1", time.Time{}); return v.Pace }
	if pace() != 0 {
		t.Fatal("no success yet: pace 0")
	}
	tr.AcquireCost("a:1", 100).Release(lb.Outcome{Kind: lb.Success, Total: 2 * time.Second})
	if p := pace(); math.Abs(p-0.02) > 1e-12 {
		t.Fatalf("first success, 2 s for 100: pace %g, want 0.02", p)
	}
	tr.AcquireCost("a:1", 100).Release(lb.Outcome{Kind: lb.Failure, Total: time.Minute})
	tr.AcquireCost("a:1", 100).Release(lb.Outcome{Kind: lb.Cancelled, Total: time.Minute})
	tr.AcquireCost("a:1", 100).Release(lb.Outcome{Kind: lb.Success}) // no time to last byte
	if p := pace(); math.Abs(p-0.02) > 1e-12 {
		t.Fatalf("failures, cancels and untimed successes moved the pace to %g", p)
	}
	tr.AcquireCost("a:1", 100).Release(lb.Outcome{Kind: lb.Success, Total: 4 * time.Second})
	if p, want := pace(), 0.9*0.02+0.1*0.04; math.Abs(p-want) > 1e-12 {
		t.Fatalf("pace %g, want the EWMA %g", p, want)
	}
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Success, Total: 30 * time.Millisecond})
	if p, want := pace(), 0.9*(0.9*0.02+0.1*0.04)+0.1*0.03; math.Abs(p-want) > 1e-12 {
		t.Fatalf("cost 0 counts as 1: pace %g, want %g", p, want)
	}
}
