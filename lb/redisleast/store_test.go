package redisleast

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

var ok = lb.Outcome{Kind: lb.Success}

func sel(t *testing.T, s *Store, cands ...string) *Lease {
	t.Helper()
	l, err := s.Select(context.Background(), cands)
	if err != nil {
		t.Fatalf("Select(%v): %v", cands, err)
	}
	if l.Fallback {
		t.Fatalf("Select(%v) fell back to local counts", cands)
	}
	return l
}

func wantCounts(t *testing.T, s *Store, want map[string]int64) {
	t.Helper()
	if got := mustCounts(t, s); !maps.Equal(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}
}

func TestSelectPicksLeastAndReleaseIsExactlyOnce(t *testing.T) {
	redistest.Each(t, testSelectPicksLeastAndReleaseIsExactlyOnce)
}

func testSelectPicksLeastAndReleaseIsExactlyOnce(t *testing.T, tg redistest.Target) {
	s := newStore(t, confFor(t, tg), "p")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	a1, a2 := sel(t, s, "a"), sel(t, s, "a")
	c1 := sel(t, s, "c")
	wantCounts(t, s, map[string]int64{"a": 2, "b": 0, "c": 1})

	b1 := sel(t, s, "a", "b", "c")
	if b1.Addr != "b" {
		t.Fatalf("picked %s, want the idle b", b1.Addr)
	}
	wantCounts(t, s, map[string]int64{"a": 2, "b": 1, "c": 1})
	// b and c tie at 1 below a: either, never a.
	if l := sel(t, s, "a", "b", "c"); l.Addr == "a" {
		t.Fatal("picked the busiest replica")
	} else {
		l.Release(ok)
	}

	if !a1.Release(ok) {
		t.Fatal("first Release returned false")
	}
	if a1.Release(ok) || a1.Release(lb.Outcome{Kind: lb.Failure}) {
		t.Fatal("repeated Release returned true")
	}
	wantCounts(t, s, map[string]int64{"a": 1, "b": 1, "c": 1})

	// A resent release script (a client retry) finds no record: no-op.
	if err := releaseScript.Exec(ctx, s.rc(), []string{s.k.load, s.k.gone, a1.ident.inst}, []string{a1.req}).Error(); err != nil {
		t.Fatalf("replayed release: %v", err)
	}
	// Same for a resent select script: it returns the recorded replica unchanged.
	arr, err := selectScript.Exec(ctx, s.rc(), []string{s.k.load, a2.ident.alive, a2.ident.inst, s.k.insts},
		[]string{"0", "1000", a2.req, a2.ident.id, "0", "b"}).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := arr[1].ToString(); got != "a" {
		t.Fatalf("replayed select returned %q, want a", got)
	}
	wantCounts(t, s, map[string]int64{"a": 1, "b": 1, "c": 1})

	// A select whose reply was lost is released as "?id" before it runs
	// (it travels on another connection): the late select is barred.
	if err := releaseScript.Exec(ctx, s.rc(), []string{s.k.load, s.k.gone, a2.ident.inst}, []string{"?late"}).Error(); err != nil {
		t.Fatal(err)
	}
	arr, err = selectScript.Exec(ctx, s.rc(), []string{s.k.load, a2.ident.alive, a2.ident.inst, s.k.insts},
		[]string{"0", "1000", "late", a2.ident.id, "0", "b"}).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := arr[0].AsInt64(); code != 3 {
		t.Fatalf("late select after its release: code %d, want 3 (barred)", code)
	}
	wantCounts(t, s, map[string]int64{"a": 1, "b": 1, "c": 1})

	for _, l := range []*Lease{a2, b1, c1} {
		l.Release(ok)
	}
	wantCounts(t, s, map[string]int64{"a": 0, "b": 0, "c": 0})
	if !drained(t, s, rawFor(t, tg)) {
		t.Fatal("records left after every release")
	}
	st := s.Stats()
	if st.Selections != 5 || st.Releases != 5 || st.Fallbacks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSelectOnlyAmongMembers(t *testing.T) { redistest.Each(t, testSelectOnlyAmongMembers) }

func testSelectOnlyAmongMembers(t *testing.T, tg redistest.Target) {
	s := newStore(t, confFor(t, tg), "p")
	if err := s.Sync(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	busy := sel(t, s, "a")
	defer busy.Release(ok)
	// x is idle as far as anyone knows, but not a member.
	for range 5 {
		l := sel(t, s, "x", "a", "y")
		if l.Addr != "a" {
			t.Fatalf("picked non-member %s", l.Addr)
		}
		l.Release(ok)
	}
	if _, err := s.Select(context.Background(), []string{"x", "y"}); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("non-member candidates: err = %v, want ErrNoCandidates", err)
	}
	if _, err := s.Select(context.Background(), nil); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("no candidates: err = %v, want ErrNoCandidates", err)
	}
}

func TestSyncKeepsCountsOfStayingReplicas(t *testing.T) {
	redistest.Each(t, testSyncKeepsCountsOfStayingReplicas)
}

func testSyncKeepsCountsOfStayingReplicas(t *testing.T, tg redistest.Target) {
	s := newStore(t, confFor(t, tg), "p")
	other := newStore(t, confFor(t, tg), "other") // another pool is untouched
	ctx := context.Background()
	if err := other.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	a1, a2, b1 := sel(t, s, "a"), sel(t, s, "a"), sel(t, s, "b")

	if err := s.Sync(ctx, []string{"b", "c"}); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, s, map[string]int64{"b": 1, "c": 0})
	if err := s.Sync(ctx, []string{"b", "c"}); err != nil { // no reset on a repeated sync
		t.Fatal(err)
	}
	wantCounts(t, s, map[string]int64{"b": 1, "c": 0})

	// a left while busy: its releases are still exact, and if it comes
	// back before they end it comes back with the requests it still has.
	a1.Release(ok)
	if err := s.Sync(ctx, []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, s, map[string]int64{"a": 1, "b": 1, "c": 0})
	if err := s.Sync(ctx, []string{"c"}); err != nil {
		t.Fatal(err)
	}
	a2.Release(ok)
	b1.Release(ok)
	wantCounts(t, s, map[string]int64{"c": 0})
	if !drained(t, s, rawFor(t, tg)) {
		t.Fatal("removed replicas left counts behind")
	}
	wantCounts(t, other, map[string]int64{"a": 0})
}

// Exact (call_rate unlimited): counts differ by at most 1. Batched (the
// default; 90 selects at once exceed the burst of 16 calls): an instance's
// picks beyond its call budget come from its view, which does not see the
// other instances' picks of the same moment, so the spread grows with the
// instances picking at once (an instance never piles up by itself:
// TestViewPicksSpreadOwnBurst); the counts reach Redis with the next batch.
func TestConcurrentInstancesBalanceAndDrain(t *testing.T) {
	for _, rate := range []int{-1, 0} {
		t.Run(fmt.Sprintf("call_rate=%d", rate), func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, tg redistest.Target) { testConcurrentInstancesBalanceAndDrain(t, tg, rate) })
		})
	}
}

func testConcurrentInstancesBalanceAndDrain(t *testing.T, tg redistest.Target, callRate int) {
	cfg := confFor(t, tg)
	cfg.CallRate = callRate
	const instances, replicas, perInstance = 3, 7, 30
	var reps []string
	for i := range replicas {
		reps = append(reps, fmt.Sprintf("10.0.0.%d:8000", i))
	}
	stores := make([]*Store, instances)
	for i := range stores {
		c := cfg
		c.InstanceID = fmt.Sprintf("i%d", i)
		stores[i] = newStore(t, c, "pool")
		if err := stores[i].Sync(context.Background(), reps); err != nil {
			t.Fatal(err)
		}
	}

	// Phase 1: every goroutine selects once and holds: least-request
	// spreads N requests over R replicas with counts differing by <= 1.
	held := selectAtOnce(t, stores, reps, perInstance)
	var wg sync.WaitGroup
	var counts map[string]int64
	var lo, hi, sum int64
	waitFor(t, "every pick to reach Redis", func() bool {
		counts = mustCounts(t, stores[0])
		lo, hi, sum = int64(1<<62), int64(-1), int64(0)
		for _, n := range counts {
			lo, hi, sum = min(lo, n), max(hi, n), sum+n
		}
		return sum == instances*perInstance
	})
	spread := int64(1)
	if callRate >= 0 {
		spread = 2 * instances
	}
	if hi-lo > spread {
		t.Fatalf("after %d concurrent selects: counts %v (sum %d, max-min %d)", instances*perInstance, counts, sum, hi-lo)
	}

	// Phase 2: churn from many goroutines while the held leases end.
	for _, s := range stores {
		for range 8 {
			wg.Go(func() {
				for range 50 {
					l, err := s.Select(context.Background(), reps)
					if err != nil {
						t.Errorf("select: %v", err)
						return
					}
					l.Release(ok)
				}
			})
		}
	}
	for _, l := range held {
		wg.Go(func() { l.Release(lb.Outcome{Kind: lb.Cancelled}) })
	}
	wg.Wait()
	// Releases beyond the call budget go with the next batch.
	waitFor(t, "every release to reach Redis", func() bool { return drained(t, stores[0], rawFor(t, tg)) })
	for _, s := range stores {
		if st := s.Stats(); st.Selections != st.Releases || st.Fallbacks != 0 {
			t.Fatalf("%s: stats %+v", s.InstanceID(), st)
		}
	}
}

func TestShedWhenEveryCandidateIsFull(t *testing.T) {
	redistest.Each(t, testShedWhenEveryCandidateIsFull)
}

func testShedWhenEveryCandidateIsFull(t *testing.T, tg redistest.Target) {
	cfg := confFor(t, tg)
	cfg.MaxInflight = 1
	a, b := newStore(t, cfg, "p"), newStore(t, cfg, "p")
	reps := []string{"r1", "r2", "r3"}
	if err := a.Sync(context.Background(), reps); err != nil {
		t.Fatal(err)
	}
	// R+1 concurrent selects from two instances: exactly one is shed.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var leases []*Lease
	shed := 0
	for i := range len(reps) + 1 {
		s := []*Store{a, b}[i%2]
		wg.Go(func() {
			l, err := s.Select(context.Background(), reps)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrSaturated):
				shed++
			case err != nil:
				t.Errorf("select: %v", err)
			default:
				leases = append(leases, l)
			}
		})
	}
	wg.Wait()
	if shed != 1 || len(leases) != len(reps) {
		t.Fatalf("shed %d, selected %d; want 1 and %d", shed, len(leases), len(reps))
	}
	wantCounts(t, a, map[string]int64{"r1": 1, "r2": 1, "r3": 1})
	if got := a.Stats().Shed + b.Stats().Shed; got != 1 {
		t.Fatalf("shed counter %d, want 1", got)
	}
	// A candidate subset that is full sheds even though others are free.
	leases[0].Release(ok)
	free := leases[0].Addr
	var full []string
	for _, r := range reps {
		if r != free {
			full = append(full, r)
		}
	}
	if _, err := a.Select(context.Background(), full); !errors.Is(err, ErrSaturated) {
		t.Fatalf("full subset: err = %v, want ErrSaturated", err)
	}
	if l := sel(t, a, reps...); l.Addr != free {
		t.Fatalf("picked %s, want the freed %s", l.Addr, free)
	} else {
		l.Release(ok)
	}
	for _, l := range leases[1:] {
		l.Release(ok)
	}
	wantCounts(t, a, map[string]int64{"r1": 0, "r2": 0, "r3": 0})
}

// selectAtOnce makes n selects on each of stores, all at once, and returns
// their leases; an error or a fallback fails the test.
func selectAtOnce(t *testing.T, stores []*Store, reps []string, n int) []*Lease {
	t.Helper()
	var mu sync.Mutex
	var held []*Lease
	var wg sync.WaitGroup
	for i := range n * len(stores) {
		s := stores[i%len(stores)]
		wg.Go(func() {
			l, err := s.Select(context.Background(), reps)
			if err != nil || l.Fallback {
				t.Errorf("select: %v (fallback %v)", err, l != nil && l.Fallback)
				return
			}
			mu.Lock()
			held = append(held, l)
			mu.Unlock()
		})
	}
	wg.Wait()
	return held
}
