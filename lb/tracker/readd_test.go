package tracker

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// A replica removed while failures had it down and a request of its was
// still in flight (one stuck on it, say), then added back while that
// request is still in flight, is a fresh replica: usable at once, not
// down on its old failures, not held back (after its down time) as if the
// old request were its one probe, and not marked down again when the old
// request fails (it reports on the replica as it was, not on the one
// added back). Its old request is still released exactly once, on the
// count it took, and the address's total counts both until then.
func TestReaddedReplicaIsFreshWhileItsOldRequestsDrain(t *testing.T) {
	now := time.Unix(100, 0)
	tr := New(Config{FailDuration: 10 * time.Second})
	tr.now = func() time.Time { return now }
	tr.SetReplicas([]string{"a:1", "b:1"})
	stuck := tr.AcquireCost("a:1", 7)
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure}) // down until 110s
	if _, usable := tr.Load("a:1"); usable {
		t.Fatal("a failed replica is usable")
	}
	tr.SetReplicas([]string{"b:1"}) // a:1 drains, stuck still on it
	now = now.Add(time.Second)
	tr.SetReplicas([]string{"a:1", "b:1"})

	if n, usable := tr.Load("a:1"); !usable || n != 0 {
		t.Fatalf("added back: Load = %d, %t; want 0 in flight (its own), usable", n, usable)
	}
	if tr.Down("a:1") {
		t.Fatal("added back: Down")
	}
	if v, ok := tr.View("a:1", time.Time{}); !ok || !v.Usable || v.InFlight != 0 || v.Active != 0 || v.ActiveCost != 0 {
		t.Fatalf("added back: View = %+v, %t; want a usable replica with nothing of its own in flight", v, ok)
	}
	if got := tr.PerReplica(); got["a:1"] != 1 {
		t.Fatalf("PerReplica = %v, want a:1=1 (the old request, still in flight)", got)
	}
	fresh := tr.AcquireUsable("a:1", 3)
	if fresh == nil {
		t.Fatal("added back: AcquireUsable refused")
	}
	if got := tr.PerReplica(); got["a:1"] != 2 {
		t.Fatalf("PerReplica = %v, want a:1=2 (old and new)", got)
	}
	var present, draining int
	for _, s := range tr.Snapshot() {
		if s.Addr == "a:1" {
			if s.Present {
				present++
				if s.InFlight != 1 || s.Down || s.Failures != 0 {
					t.Fatalf("present a:1 %+v, want 1 in flight, up, no failures", s)
				}
			} else {
				draining++
				if s.InFlight != 1 {
					t.Fatalf("draining a:1 %+v, want 1 in flight", s)
				}
			}
		}
	}
	if present != 1 || draining != 1 {
		t.Fatalf("snapshot has a:1 present %d, draining %d times; want once each", present, draining)
	}

	// The old request fails: the replica added back is not down for it.
	if !stuck.Release(lb.Outcome{Kind: lb.Failure}) || stuck.Release(lb.Outcome{Kind: lb.Failure}) {
		t.Fatal("the old lease must release once, then no more")
	}
	if _, usable := tr.Load("a:1"); !usable || tr.Down("a:1") {
		t.Fatal("the old request's failure marked the replica added back down")
	}
	if v, _ := tr.View("a:1", time.Time{}); v.InFlight != 1 || v.ActiveCost != 3 {
		t.Fatalf("after the old release: View = %+v, want 1 in flight at cost 3 (the new one)", v)
	}
	if got := tr.PerReplica(); len(got) != 1 || got["a:1"] != 1 {
		t.Fatalf("PerReplica = %v, want a:1=1", got)
	}
	if len(tr.Snapshot()) != 2 {
		t.Fatalf("snapshot %+v: the drained old entry is not forgotten", tr.Snapshot())
	}
	fresh.Release(lb.Outcome{Kind: lb.Success})
	if n := tr.InFlight(); n != 0 {
		t.Fatalf("in flight after every release: %d", n)
	}
}

// A replica that failures have down, with a request in flight, removed
// and added back once its down time is over: the old request is not its
// probe, the replica takes requests.
func TestReaddedReplicaIsNotHeldByAnOldRequestAfterItsDownTime(t *testing.T) {
	now := time.Unix(100, 0)
	tr := New(Config{FailDuration: 10 * time.Second})
	tr.now = func() time.Time { return now }
	tr.SetReplicas([]string{"a:1"})
	stuck := tr.Acquire("a:1")
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure})
	tr.SetReplicas(nil)
	now = now.Add(time.Minute)
	tr.SetReplicas([]string{"a:1"})
	for i := range 3 {
		l := tr.AcquireUsable("a:1", 1)
		if l == nil {
			t.Fatalf("request %d to a replica added back, its down time over: refused", i)
		}
		defer l.Release(lb.Outcome{Kind: lb.Success})
	}
	stuck.Release(lb.Outcome{Kind: lb.Cancelled})
}

// Pickers set the union of the old and the new list first (duplicates
// and all), then the new list: a replica added back that way is fresh
// once, not replaced again by the second call or by its duplicate.
func TestReaddedThroughAUnionWithDuplicates(t *testing.T) {
	tr := New(Config{})
	tr.SetReplicas([]string{"a:1", "b:1"})
	old := tr.Acquire("a:1")
	tr.SetReplicas([]string{"b:1"})
	tr.SetReplicas([]string{"b:1", "a:1", "b:1", "a:1"}) // old ∪ new
	l := tr.Acquire("a:1")
	tr.SetReplicas([]string{"a:1", "b:1"})
	if v, _ := tr.View("a:1", time.Time{}); v.InFlight != 1 {
		t.Fatalf("a:1 in flight %d, want 1: the entry added back was replaced", v.InFlight)
	}
	if got := tr.PerReplica(); got["a:1"] != 2 {
		t.Fatalf("PerReplica = %v, want a:1=2", got)
	}
	old.Release(lb.Outcome{Kind: lb.Success})
	l.Release(lb.Outcome{Kind: lb.Success})
	if got := tr.PerReplica(); len(got) != 0 || len(tr.Snapshot()) != 2 {
		t.Fatalf("after every release: PerReplica %v, snapshot %+v", got, tr.Snapshot())
	}
}

// Removed and added back again and again while leases come and go, on
// many goroutines: every count ends at zero, never goes negative, and
// nothing drained is left behind.
func TestReaddChurnCountsEveryReleaseOnce(t *testing.T) {
	tr := New(Config{MaxFails: 2, FailDuration: time.Millisecond})
	all := []string{"a:1", "b:1", "c:1"}
	tr.SetReplicas(all)
	stop := make(chan struct{})
	var setter sync.WaitGroup
	setter.Add(1)
	go func() {
		defer setter.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			var set []string
			for _, a := range all {
				if rng.IntN(2) == 0 {
					set = append(set, a, a)
				}
			}
			tr.SetReplicas(set)
			for _, s := range tr.Snapshot() {
				if s.InFlight < 0 {
					t.Errorf("%s in flight %d", s.Addr, s.InFlight)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			var held []*Lease
			for i := range 3000 {
				addr := all[rng.IntN(len(all))]
				var l *Lease
				if i%2 == 0 {
					l = tr.AcquireUsable(addr, int64(rng.IntN(50)))
				} else {
					l = tr.AcquireCost(addr, int64(rng.IntN(50)))
				}
				if l != nil {
					held = append(held, l)
				}
				if len(held) > 4 || (len(held) > 0 && rng.IntN(2) == 0) {
					k := rng.IntN(len(held))
					kind := []lb.OutcomeKind{lb.Success, lb.Failure, lb.Cancelled}[rng.IntN(3)]
					if !held[k].Release(lb.Outcome{Kind: kind, Total: time.Millisecond}) {
						t.Error("first release returned false")
					}
					held = append(held[:k], held[k+1:]...)
				}
				tr.View(addr, time.Now())
			}
			for _, l := range held {
				l.Release(lb.Outcome{Kind: lb.Cancelled})
			}
		}()
	}
	wg.Wait()
	close(stop)
	setter.Wait()
	tr.SetReplicas(all)
	for _, s := range tr.Snapshot() {
		if s.InFlight != 0 || !s.Present {
			t.Fatalf("after every release: %+v (want every replica present and idle, nothing draining)", s)
		}
	}
	for _, a := range all {
		if v, _ := tr.View(a, time.Time{}); v.InFlight != 0 || v.ActiveCost != 0 {
			t.Fatalf("%s: %+v after every release", a, v)
		}
	}
	tr.SetReplicas(nil)
	if s := tr.Snapshot(); len(s) != 0 {
		t.Fatalf("removed and idle, still tracked: %+v", s)
	}
}

// Costs a caller did not bound cannot wrap a replica's sum negative (a
// loaded replica would rank as idle): each counts at most 2^40, and
// negative ones as 0.
func TestHugeCostsDoNotOverflowTheSum(t *testing.T) {
	tr := New(Config{})
	tr.SetReplicas([]string{"a:1"})
	const maxInt64 = 1<<63 - 1
	var held []*Lease
	for range 4 {
		held = append(held, tr.AcquireCost("a:1", maxInt64))
	}
	held = append(held, tr.AcquireCost("a:1", -maxInt64))
	v, _ := tr.View("a:1", time.Time{})
	if v.ActiveCost != 4<<40 || v.Active != 5 {
		t.Fatalf("View = %+v, want 5 active at cost 4·2^40", v)
	}
	for _, l := range held {
		l.Release(lb.Outcome{Kind: lb.Success, Total: time.Second})
	}
	if v, _ := tr.View("a:1", time.Time{}); v.ActiveCost != 0 || v.InFlight != 0 || v.Pace <= 0 {
		t.Fatalf("after every release: %+v", v)
	}
}

// A fail_duration of years, doubled up to 16 times, must not wrap the
// down time into the past (the replica came back up on its fifth failure).
func TestLongFailDurationSaturates(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tr := New(Config{FailDuration: 20 * 365 * 24 * time.Hour})
	tr.now = func() time.Time { return now }
	tr.SetReplicas([]string{"a:1"})
	for i := range 8 {
		tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure})
		if !tr.Down("a:1") {
			t.Fatalf("up again after failure %d of a 20-year fail_duration", i+1)
		}
	}
	tr.Configure(Config{FailDuration: 200 * 365 * 24 * time.Hour})
	if !tr.Down("a:1") {
		t.Fatal("up again after a reload to a 200-year fail_duration")
	}
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Success})
	if tr.Down("a:1") {
		t.Fatal("a success brings it back")
	}
}
