package redisleast

import (
	"context"
	"maps"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// A batch whose reply was lost is sent again as it was: Redis applies it
// once, and a replayed exact pick answers the replica it recorded.
func TestBatchIsAppliedOnce(t *testing.T) { redistest.Each(t, testBatchIsAppliedOnce) }

func testBatchIsAppliedOnce(t *testing.T, tg redistest.Target) {
	s := newStore(t, confFor(t, tg), "p")
	if err := s.Sync(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	id := s.ident.Load()
	bt := &batch{ident: id, seq: 1, cands: []string{"a", "b"},
		events: []event{{'+', "r1", "a"}, {'+', "r2", "a"}, {'-', "r1", "a"}, {'*', "r3", ""}}}
	first := batcherOf(s).send(bt)
	if first.err != nil {
		t.Fatal(first.err)
	}
	if first.picked != "b" { // a holds r2, b nothing
		t.Fatalf("exact pick %q, want b", first.picked)
	}
	again := batcherOf(s).send(bt)
	if again.err != nil || again.picked != "b" {
		t.Fatalf("replayed batch: picked %q, err %v; want b", again.picked, again.err)
	}
	wantCounts(t, s, map[string]int64{"a": 1, "b": 1})
	// The next number applies; an older one does not.
	if r := batcherOf(s).send(&batch{ident: id, seq: 2, events: []event{{'-', "r2", "a"}, {'-', "r3", "b"}}}); r.err != nil {
		t.Fatal(r.err)
	}
	if r := batcherOf(s).send(&batch{ident: id, seq: 1, events: []event{{'+', "r4", "a"}}}); r.err != nil {
		t.Fatal(r.err)
	}
	wantCounts(t, s, map[string]int64{"a": 0, "b": 0})
	if !drained(t, s, rawFor(t, tg)) {
		t.Fatal("records left")
	}
}

// Beyond the call budget an instance picks from its view plus its own
// picks not yet in Redis: a burst from one instance spreads evenly, and
// every pick and release reaches Redis once, within the budget's calls.
func TestViewPicksSpreadOwnBurst(t *testing.T) { redistest.Each(t, testViewPicksSpreadOwnBurst) }

func testViewPicksSpreadOwnBurst(t *testing.T, tg redistest.Target) {
	cfg := confFor(t, tg)
	cfg.CallRate = 1 // the burst of 16 calls, then one a second
	s := newStore(t, cfg, "p")
	reps := []string{"a", "b", "c", "d"}
	if err := s.Sync(context.Background(), reps); err != nil {
		t.Fatal(err)
	}
	calls0 := s.Stats().ScriptCount
	held := selectAtOnce(t, []*Store{s}, reps, 64)
	per := map[string]int{}
	for _, l := range held {
		per[l.Addr]++
	}
	for _, a := range reps {
		if per[a] != 16 {
			t.Fatalf("64 picks from one instance: %v, want 16 each", per)
		}
	}
	if st := s.Stats(); st.ViewPicks != 64-callBurst {
		t.Fatalf("%d view picks, want %d (the picks beyond the burst of calls)", st.ViewPicks, 64-callBurst)
	}
	if calls := s.Stats().ScriptCount - calls0; calls > callBurst+2 {
		t.Fatalf("%d Redis calls for 64 picks with a budget of %d at once", calls, callBurst)
	}
	waitFor(t, "the view picks to reach Redis", func() bool {
		return mustCounts(t, s)["a"] == 16 && mustCounts(t, s)["d"] == 16
	})
	for _, l := range held {
		l.Release(lb.Outcome{Kind: lb.Success})
	}
	waitFor(t, "the releases to reach Redis", func() bool { return drained(t, s, rawFor(t, tg)) })
	if st := s.Stats(); st.Selections != st.Releases || st.Fallbacks != 0 || st.Pending != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A reload that sets max_inflight while batched leases are out: they are
// released through the batches, the new picks take the one-call path.
func TestSwitchingToMaxInflightKeepsBatchedLeasesExact(t *testing.T) {
	addr := testRedis(t)
	cfg := testConfig(t, addr)
	s := newStore(t, cfg, "p")
	reps := []string{"a", "b"}
	if err := s.Sync(context.Background(), reps); err != nil {
		t.Fatal(err)
	}
	old := []*Lease{sel(t, s, reps...), sel(t, s, reps...)}
	capped := cfg
	capped.MaxInflight = 2
	if err := s.Configure(capped); err != nil {
		t.Fatal(err)
	}
	l := sel(t, s, reps...)
	if l.batched || !old[0].batched {
		t.Fatalf("batched: old %v, new %v", old[0].batched, l.batched)
	}
	if c := mustCounts(t, s); c["a"]+c["b"] != 3 || c["a"] == 0 || c["b"] == 0 {
		t.Fatalf("counts %v after 3 picks over 2 replicas", c)
	}
	for _, l := range append(old, l) {
		l.Release(lb.Outcome{Kind: lb.Success})
	}
	waitFor(t, "every release to reach Redis", func() bool { return drained(t, s, raw(t, addr)) })
}

// The flusher sends what is queued when nothing else comes along: a pick
// made from the view reaches Redis within about two budget intervals.
func TestFlusherSendsTheTail(t *testing.T) {
	s, addr, _ := budgetSpent(t, 50)
	l := sel(t, s, "a")
	start := time.Now()
	waitFor(t, "the last pick to reach Redis", func() bool { return mustCounts(t, s)["a"] == 1 })
	t.Logf("reached Redis after %v", time.Since(start))
	l.Release(lb.Outcome{Kind: lb.Success})
	waitFor(t, "its release to reach Redis", func() bool { return drained(t, s, raw(t, addr)) })
}

// The flusher waiting for the budget when the breaker opened used to stay
// marked as waiting: no later poke woke it, and what was queued after the
// outage reached Redis only if a pick or release came along with the
// budget to send it.
func TestFlusherWakesAfterAnOutageDuringItsWait(t *testing.T) {
	s, addr, _ := budgetSpent(t, 10)
	l := sel(t, s, "a") // from the view: the flusher waits ~200 ms for the budget
	waitFor(t, "the flusher to wait for the budget", func() bool {
		batcherOf(s).mu.Lock()
		defer batcherOf(s).mu.Unlock()
		return batcherOf(s).armed
	})
	s.br.record(context.DeadlineExceeded) // Redis "times out" meanwhile
	time.Sleep(300 * time.Millisecond)    // the flusher's wait ends with the breaker open
	s.br.close()
	for queued := 0; queued == 0; { // spend what the budget regained
		sel(t, s, "a").Release(ok)
		batcherOf(s).mu.Lock()
		queued = len(batcherOf(s).queue)
		batcherOf(s).mu.Unlock()
	}
	l.Release(ok) // queued too: only the flusher sends them now
	waitFor(t, "the queued picks and releases to reach Redis", func() bool { return drained(t, s, raw(t, addr)) })
}

// A reload to call_rate unlimited while picks and releases wait for the
// budget: they go at once (the budget used to read the new rate as a
// negative interval and refuse every call).
func TestCallRateUnlimitedByReloadSendsWhatWaits(t *testing.T) {
	s, addr, cfg := budgetSpent(t, 1) // the next call in ~1 s
	l := sel(t, s, "a")
	unlimited := cfg
	unlimited.CallRate = -1
	if err := s.Configure(unlimited); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiting pick to reach Redis", func() bool { return mustCounts(t, s)["a"] == 1 })
	l.Release(ok)
	waitFor(t, "its release to reach Redis", func() bool { return drained(t, s, raw(t, addr)) })
}

// budgetSpent is a store at rate calls a second over one replica "a"
// whose burst of calls was just spent (each a pick or a release), and
// whose breaker only the test opens and closes.
func budgetSpent(t *testing.T, rate int) (*Store, string, Config) {
	addr := testRedis(t)
	cfg := testConfig(t, addr)
	cfg.CallRate = rate
	cfg.BreakerBackoff = time.Hour
	s := newStore(t, cfg, "p")
	if err := s.Sync(context.Background(), []string{"a"}); err != nil {
		t.Fatal(err)
	}
	for range callBurst / 2 {
		sel(t, s, "a").Release(ok)
	}
	return s, addr, cfg
}

// batcherOf is the batcher of a least-request store.
func batcherOf(s *Store) *batcher { return &s.mode.(*leastRequest).batch }

// An exact pick whose reply is lost sends its request to the view's
// least-loaded replica, and its batch goes again until Redis answers. But
// the script picks by itself, among Redis's counts: when the lost try ran
// (or the resent one runs) it may record the request on another replica
// than the one the request went to, which then counts one request too few
// and the other one too many for as long as the request runs. The count
// must follow the request.
func TestLostExactPickIsCountedWhereItsRequestWent(t *testing.T) {
	srv := privateRedis(t)
	cfg := testConfig(t, srv.Addr)
	cfg.ReadTimeout = 200 * time.Millisecond
	cfg.BreakerBackoff = 50 * time.Millisecond
	s := newStore(t, cfg, "lost")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	hb := sel(t, s, "b") // the view: a 0, b 1
	c := raw(t, srv.Addr)
	// Load the view does not show yet: in Redis a is the busier one.
	if err := c.Do(ctx, c.B().Zincrby().Key(s.k.load).Increment(5).Member("a").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	srv.Signal(syscall.SIGSTOP)
	l, err := s.Select(ctx, []string{"a", "b"}) // its reply is lost: the request goes to the view's a
	srv.Signal(syscall.SIGCONT)                 // the script it sent runs now, and picks b
	if err != nil {
		t.Fatal(err)
	}
	if !l.Fallback || l.Addr != "a" {
		t.Fatalf("lease %s (fallback %v): want a local pick of a while Redis is frozen", l.Addr, l.Fallback)
	}
	var counts map[string]int64
	waitFor(t, "the pick in Redis where its request went (a 6, b 1)", func() bool {
		counts, _ = s.Counts(ctx)
		if maps.Equal(counts, map[string]int64{"a": 6, "b": 1}) {
			return true
		}
		t.Logf("counts %v", counts)
		return false
	})
	l.Release(ok)
	hb.Release(ok)
	waitFor(t, "every release in Redis", func() bool {
		c, err := s.Counts(ctx)
		return err == nil && maps.Equal(c, map[string]int64{"a": 5, "b": 0})
	})
}

// Instances whose backend sets diverge: the other instance synced last,
// without c, so Redis does not count c. An exact pick never takes c (it
// picks among members), but a pick from the view read c as idle, always
// (its own picks of c left its delta when their batch was applied, and
// the view never shows c), and sent it most requests. A candidate the
// view does not count is taken only when it counts none of them.
func TestViewPicksLeaveACandidateRedisDoesNotCount(t *testing.T) {
	redistest.Each(t, testViewPicksLeaveACandidateRedisDoesNotCount)
}

func testViewPicksLeaveACandidateRedisDoesNotCount(t *testing.T, tg redistest.Target) {
	cfg := confFor(t, tg)
	cfg.CallRate = 1 // the burst of 16 calls, then one a second
	cfg.BreakerBackoff = time.Hour
	s, other := newStore(t, cfg, "p"), newStore(t, cfg, "p")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	if err := other.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	var held []*Lease
	for range 3 {
		held = append(held, sel(t, other, "a"), sel(t, other, "b"))
	}
	for range callBurst / 2 { // spend s's budget; the last reply is its view
		sel(t, s, "a", "b").Release(ok)
	}
	before := s.Stats().ViewPicks
	onC := 0
	for range 20 {
		l := sel(t, s, "a", "b", "c")
		if l.Addr == "c" {
			onC++
		}
		held = append(held, l)
	}
	if s.Stats().ViewPicks == before {
		t.Fatal("no pick came from the view: the budget was not spent as planned")
	}
	if onC > 0 {
		t.Fatalf("%d of 20 picks went to c, which Redis does not count (a and b hold 3 each)", onC)
	}
	for _, l := range held {
		l.Release(ok)
	}
}
