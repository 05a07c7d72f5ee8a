package modelmetrics

import (
	"sync/atomic"
	"testing"
	"time"
)

// A caller holding requests on the last samples asks for fresh ones: a
// Refresh scrapes every target long before the next Interval, and the
// new sample reaches the OnSample hook.
func TestRefreshScrapesNowAndHandsTheSampleOn(t *testing.T) {
	f := newFakeReplica(t, vllmBody(3, 8, 0.5))
	s := New(Config{Interval: time.Hour, MinRefresh: time.Millisecond})
	var got atomic.Pointer[Sample]
	var calls atomic.Int64
	s.OnSample(func(addr string, smp Sample) {
		if addr == "r" {
			got.Store(&smp)
			calls.Add(1)
		}
	})
	s.SetTargets(map[string]string{"r": f.URL})
	run(t, s)
	waitFor(t, "the first scrape", func() bool { return calls.Load() == 1 })
	if smp := got.Load(); smp.Waiting != 3 || smp.Running != 8 || !smp.Have.Waiting {
		t.Fatalf("hook got %+v, want waiting 3, running 8", *smp)
	}
	f.set(vllmBody(0, 9, 0.5))
	s.Refresh()
	waitFor(t, "the refreshed scrape", func() bool { return calls.Load() == 2 })
	if smp := got.Load(); smp.Waiting != 0 || smp.Running != 9 {
		t.Fatalf("after Refresh the hook got %+v, want waiting 0, running 9", *smp)
	}
}

// Refreshes are merged: however many come, rounds are at most one per
// MinRefresh (plus the one at start), and one asked within MinRefresh of
// the last round still comes when it has passed.
func TestRefreshesAreMergedToOnePerMinRefresh(t *testing.T) {
	f := newFakeReplica(t, vllmBody(0, 1, 0.1))
	const gap = 100 * time.Millisecond
	s := New(Config{Interval: time.Hour, MinRefresh: gap})
	s.SetTargets(map[string]string{"r": f.URL})
	start := time.Now()
	run(t, s)
	waitFor(t, "the first scrape", func() bool { return f.hits.Load() == 1 })
	for i := 0; i < 200; i++ {
		s.Refresh()
		time.Sleep(time.Millisecond)
	}
	waitFor(t, "the held refresh", func() bool { return f.hits.Load() >= 2 })
	elapsed := time.Since(start)
	if max := 1 + int64(elapsed/gap) + 1; f.hits.Load() > max {
		t.Fatalf("%d scrapes in %v for 200 Refreshes, want at most %d (one per %v)", f.hits.Load(), elapsed, max, gap)
	}
}

// A refresh asked from the OnSample hook (qll asks again for a replica
// whose sample shows requests waiting) is not lost: the hook runs after
// the target's scrape is over, so the round it asks for scrapes it again.
// Before, the hook ran while the scrape still held the target, and a
// round that came quickly enough (here: while the hook is still busy)
// skipped it and forgot the ask.
func TestRefreshAskedFromTheHookIsNotLost(t *testing.T) {
	f := newFakeReplica(t, vllmBody(1, 4, 0.3))
	s := New(Config{Interval: time.Hour, MinRefresh: time.Millisecond})
	var calls atomic.Int64
	s.OnSample(func(addr string, _ Sample) {
		if calls.Add(1) <= 3 {
			s.RefreshTargets(addr)
			time.Sleep(50 * time.Millisecond) // the round runs meanwhile
		}
	})
	s.SetTargets(map[string]string{"r": f.URL})
	run(t, s)
	waitFor(t, "three scrapes asked from the hook", func() bool { return f.hits.Load() >= 4 })
}
