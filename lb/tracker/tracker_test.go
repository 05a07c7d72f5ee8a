package tracker

import (
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

func TestCountsAreExactUnderConcurrency(t *testing.T) {
	tr := New(Config{})
	tr.SetReplicas([]string{"a:1", "b:1"})
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				l := tr.Acquire([]string{"a:1", "b:1"}[(g+i)%2])
				if l == nil {
					continue
				}
				l.Release(lb.Outcome{Kind: lb.Cancelled})
				l.Release(lb.Outcome{Kind: lb.Cancelled}) // no-op
			}
			if g%4 == 0 {
				tr.SetReplicas([]string{"a:1", "b:1"})
			}
		}(g)
	}
	wg.Wait()
	if n := tr.InFlight(); n != 0 {
		t.Fatalf("in flight after all releases: %d", n)
	}
}

func TestFailureMarksDownThenOneProbeThenRecovery(t *testing.T) {
	now := time.Unix(0, 0)
	tr := New(Config{MaxFails: 2, FailDuration: 10 * time.Second})
	tr.now = func() time.Time { return now }
	tr.SetReplicas([]string{"a:1"})
	fail := func() { tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure}) }
	fail()
	if _, ok := tr.Load("a:1"); !ok {
		t.Fatal("one failure of max_fails 2 must not mark down")
	}
	fail()
	if _, ok := tr.Load("a:1"); ok {
		t.Fatal("two consecutive failures must mark down")
	}
	now = now.Add(11 * time.Second)
	probe := tr.Acquire("a:1")
	if _, ok := tr.Load("a:1"); ok {
		t.Fatal("down time over: only one probe at a time")
	}
	probe.Release(lb.Outcome{Kind: lb.Success})
	if n, ok := tr.Load("a:1"); !ok || n != 0 {
		t.Fatalf("after a successful probe: load %d usable %v", n, ok)
	}
	// A cancelled attempt says nothing about the replica.
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Cancelled})
	if s := tr.Snapshot()[0]; s.Failures != 2 || s.Down {
		t.Fatalf("stats %+v", s)
	}
}

// Down agrees with Load for known replicas and is false for unknown ones.
func TestDownFollowsHealthAndIgnoresUnknownAddresses(t *testing.T) {
	now := time.Unix(0, 0)
	tr := New(Config{FailDuration: 10 * time.Second})
	tr.now = func() time.Time { return now }
	tr.SetReplicas([]string{"a:1"})
	if tr.Down("a:1") || tr.Down("unknown:1") {
		t.Fatal("down before any failure")
	}
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure})
	if !tr.Down("a:1") || tr.Down("unknown:1") {
		t.Fatal("a failed replica must be down, an unknown one not")
	}
	now = now.Add(11 * time.Second)
	if tr.Down("a:1") {
		t.Fatal("down time over: a probe may go")
	}
	probe := tr.Acquire("a:1")
	if !tr.Down("a:1") {
		t.Fatal("one probe at a time")
	}
	probe.Release(lb.Outcome{Kind: lb.Success})
	if tr.Down("a:1") {
		t.Fatal("a successful probe brings it back")
	}
}

func TestRemovedReplicaDrainsThenIsForgotten(t *testing.T) {
	tr := New(Config{})
	tr.SetReplicas([]string{"a:1"})
	l := tr.Acquire("a:1")
	tr.SetReplicas(nil)
	if tr.Acquire("a:1") != nil {
		t.Fatal("a removed replica must not get new requests")
	}
	if _, ok := tr.Load("a:1"); ok {
		t.Fatal("a removed replica is not usable")
	}
	if len(tr.Snapshot()) != 1 {
		t.Fatal("a draining replica must still be tracked")
	}
	l.Release(lb.Outcome{Kind: lb.Success})
	if len(tr.Snapshot()) != 0 {
		t.Fatal("drained replica not forgotten")
	}
}

func TestActiveStopsCountingRequestsOlderThanTheTimeout(t *testing.T) {
	now := time.Unix(100, 0)
	tr := New(Config{})
	tr.now = func() time.Time { return now }
	tr.SetReplicas([]string{"a:1"})
	old := tr.AcquireCost("a:1", 1000)
	now = now.Add(time.Minute)
	mid := tr.AcquireCost("a:1", 200)
	now = now.Add(time.Minute)
	recent := tr.AcquireCost("a:1", 30)
	if n, c := active(tr, "a:1", now.Add(-90*time.Second)); n != 2 || c != 230 {
		t.Fatalf("active = %d (cost %d), want 2 (230): the oldest timed out", n, c)
	}
	mid.Release(lb.Outcome{Kind: lb.Success})
	mid.Release(lb.Outcome{Kind: lb.Success}) // a second release changes nothing
	if n, c := active(tr, "a:1", now.Add(-90*time.Second)); n != 1 || c != 30 {
		t.Fatalf("after releasing the middle one: %d (cost %d), want 1 (30)", n, c)
	}
	if n, c := active(tr, "a:1", time.Time{}); n != 2 || c != 1030 {
		t.Fatalf("without a cutoff: %d (cost %d), want 2 (1030)", n, c)
	}
	old.Release(lb.Outcome{Kind: lb.Cancelled})
	recent.Release(lb.Outcome{Kind: lb.Success})
	if n, c := active(tr, "a:1", time.Time{}); n != 0 || c != 0 {
		t.Fatalf("after all releases: %d (cost %d)", n, c)
	}
}

func TestCostsReleasedExactlyOnceUnderConcurrency(t *testing.T) {
	tr := New(Config{})
	tr.SetReplicas([]string{"a:1", "b:1"})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				addr := []string{"a:1", "b:1"}[(g+i)%2]
				l := tr.AcquireCost(addr, int64(1+i%97))
				active(tr, addr, time.Now().Add(-time.Hour))
				// Release races with itself: only one may count.
				var rw sync.WaitGroup
				for range 2 {
					rw.Add(1)
					go func() { defer rw.Done(); l.Release(lb.Outcome{Kind: lb.Success}) }()
				}
				rw.Wait()
			}
		}()
	}
	wg.Wait()
	for _, addr := range []string{"a:1", "b:1"} {
		if n, c := active(tr, addr, time.Time{}); n != 0 || c != 0 {
			t.Fatalf("%s: %d in flight, cost %d after every release", addr, n, c)
		}
	}
}

func TestLeaseReplicaAndPerReplicaCounts(t *testing.T) {
	tr := New(Config{MaxFails: 2})
	tr.SetReplicas([]string{"a:1", "b:1"})
	var l lb.Lease = tr.AcquireCost("a:1", 5)
	if l.Replica() != "a:1" {
		t.Fatalf("Replica() = %q", l.Replica())
	}
	b := tr.Acquire("b:1")
	b2 := tr.Acquire("b:1")
	tr.SetReplicas([]string{"a:1"}) // b:1 drains, still counted
	if got := tr.PerReplica(); len(got) != 2 || got["a:1"] != 1 || got["b:1"] != 2 {
		t.Fatalf("PerReplica() = %v, want a:1=1 b:1=2", got)
	}
	l.Release(lb.Outcome{Kind: lb.Success})
	b.Release(lb.Outcome{Kind: lb.Cancelled})
	b2.Release(lb.Outcome{Kind: lb.Cancelled})
	if got := tr.PerReplica(); len(got) != 0 {
		t.Fatalf("PerReplica() = %v after all releases, want empty", got)
	}
	if c := tr.Config(); c.MaxFails != 2 || c.FailDuration != 5*time.Second {
		t.Fatalf("Config() = %+v", c)
	}
}

// active is View's Active and ActiveCost (0, 0 for an unknown replica).
func active(tr *Tracker, addr string, cutoff time.Time) (int, int64) {
	v, _ := tr.View(addr, cutoff)
	return v.Active, v.ActiveCost
}
