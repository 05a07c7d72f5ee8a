package modelmetrics

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A replica that exports no metrics answers 404 every time: it is tried
// again after Interval, then twice as long per further failure up to
// MaxBackoff, reads Stale with its error throughout, and is scraped every
// Interval again from its first success. The clock is the test's: each
// round is one tick.
func TestAFailingTargetBacksOffAndRecovers(t *testing.T) {
	bad := newFakeReplica(t, vllmBody(1, 1, 0.1))
	bad.status.Store(http.StatusNotFound)
	good := newFakeReplica(t, vllmBody(1, 1, 0.1))
	var now atomic.Int64
	start := time.Unix(1000, 0)
	now.Store(start.UnixNano())
	s := New(Config{Interval: time.Second, MaxBackoff: 8 * time.Second})
	s.now = func() time.Time { return time.Unix(0, now.Load()) }
	s.SetTargets(map[string]string{"bad": bad.URL, "good": good.URL})
	defer s.own.CloseIdleConnections()

	var scrapedAt []int
	tick := func(i int) {
		now.Store(start.Add(time.Duration(i) * time.Second).UnixNano())
		before := bad.hits.Load()
		scrapeOnce(s)
		if bad.hits.Load() > before {
			scrapedAt = append(scrapedAt, i)
		}
	}
	for i := 0; i < 40; i++ {
		tick(i)
		if v, fr := s.Get("bad"); fr != Stale || v.Err == nil || !strings.Contains(v.Err.Error(), "404") {
			t.Fatalf("tick %d: backed-off target reads %v %+v, want stale with its 404", i, fr, v)
		}
	}
	if want := []int{0, 1, 3, 7, 15, 23, 31, 39}; !slices.Equal(scrapedAt, want) {
		t.Fatalf("404 target scraped at ticks %v, want %v", scrapedAt, want)
	}
	if n := good.hits.Load(); n != 40 {
		t.Fatalf("healthy target scraped %d times in 40 ticks", n)
	}
	st := s.Stats("bad")
	if st.ConsecutiveFailures != 8 || !st.NextScrape.Equal(start.Add(47*time.Second)) || st.Freshness != Stale {
		t.Fatalf("stats of the backed-off target: %+v", st)
	}

	bad.status.Store(http.StatusOK)
	scrapedAt = nil
	for i := 40; i < 52; i++ {
		tick(i)
	}
	if want := []int{47, 48, 49, 50, 51}; !slices.Equal(scrapedAt, want) {
		t.Fatalf("after it answers, scraped at ticks %v, want %v", scrapedAt, want)
	}
	if st := s.Stats("bad"); st.ConsecutiveFailures != 0 || !st.NextScrape.IsZero() || st.Freshness != Fresh {
		t.Fatalf("stats after a success: %+v", st)
	}
}

// A replica that exported metrics before and fails now is restarting or
// overloaded, not metric-less: it is retried at most every
// recoveringBackoff Intervals, so its signals come back soon after it does.
func TestATargetThatAnsweredBeforeBacksOffLess(t *testing.T) {
	r := newFakeReplica(t, vllmBody(1, 1, 0.1))
	var now atomic.Int64
	start := time.Unix(1000, 0)
	now.Store(start.UnixNano())
	s := New(Config{Interval: time.Second, MaxBackoff: 30 * time.Second})
	s.now = func() time.Time { return time.Unix(0, now.Load()) }
	s.SetTargets(map[string]string{"r": r.URL})
	defer s.own.CloseIdleConnections()
	var scrapedAt []int
	for i := 0; i < 30; i++ {
		if i == 2 {
			r.status.Store(http.StatusServiceUnavailable)
		}
		now.Store(start.Add(time.Duration(i) * time.Second).UnixNano())
		before := r.hits.Load()
		scrapeOnce(s)
		if r.hits.Load() > before {
			scrapedAt = append(scrapedAt, i)
		}
	}
	if want := []int{0, 1, 2, 3, 5, 9, 13, 17, 21, 25, 29}; !slices.Equal(scrapedAt, want) {
		t.Fatalf("scraped at ticks %v, want %v", scrapedAt, want)
	}
}

// The wait doubles from Interval and stops at MaxBackoff.
func TestBackoffDoublesUpToTheCap(t *testing.T) {
	for fails, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		5: 16 * time.Second, 6: 30 * time.Second, 1000: 30 * time.Second} {
		if got := backoff(time.Second, 30*time.Second, fails); got != want {
			t.Errorf("backoff after %d failures: %v, want %v", fails, got, want)
		}
	}
}

func TestMaxBackoffDefaultsAndValidation(t *testing.T) {
	if c := (Config{}).WithDefaults(); c.MaxBackoff != 30*time.Second {
		t.Errorf("default MaxBackoff %v", c.MaxBackoff)
	}
	if c := (Config{Interval: time.Minute}).WithDefaults(); c.MaxBackoff != time.Minute {
		t.Errorf("MaxBackoff under Interval: %v, want Interval", c.MaxBackoff)
	}
	if err := (Config{MaxBackoff: -time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "max_backoff") {
		t.Errorf("negative MaxBackoff: %v", err)
	}
}

// Refresh and RefreshTargets, however often, leave a backed-off target
// alone: a caller refreshing while requests wait must not hammer a
// replica that answers 404.
func TestRefreshDoesNotBypassTheBackoff(t *testing.T) {
	bad := newFakeReplica(t, "")
	bad.status.Store(http.StatusNotFound)
	good := newFakeReplica(t, vllmBody(0, 1, 0.1))
	// The first failure's wait is Interval: an hour, past the test.
	s := New(Config{Interval: time.Hour, MinRefresh: time.Millisecond})
	s.SetTargets(map[string]string{"bad": bad.URL, "good": good.URL})
	run(t, s)
	waitFor(t, "the first scrapes", func() bool {
		_, fr := s.Get("bad")
		return fr == Stale && good.hits.Load() >= 1
	})
	waitFor(t, "refreshed scrapes of the healthy target", func() bool {
		s.Refresh()
		s.RefreshTargets("bad", "good")
		time.Sleep(time.Millisecond)
		return good.hits.Load() >= 10
	})
	if n := bad.hits.Load(); n != 1 {
		t.Fatalf("404 target scraped %d times, want only the first (the healthy one: %d)", n, good.hits.Load())
	}
}

// With real time: over the same window a 404 target is scraped far less
// often than a healthy one, and every Interval again once it answers.
func TestABackedOffTargetIsScrapedRarelyThenEveryIntervalAgain(t *testing.T) {
	bad := newFakeReplica(t, vllmBody(1, 1, 0.1))
	bad.status.Store(http.StatusNotFound)
	good := newFakeReplica(t, vllmBody(1, 1, 0.1))
	s := New(Config{Interval: 10 * time.Millisecond, MaxBackoff: 160 * time.Millisecond})
	s.SetTargets(map[string]string{"bad": bad.URL, "good": good.URL})
	run(t, s)
	// 60 ticks take 7 scrapes with the back-off (ticks 0, 1, 3, 7, 15,
	// 31, 47), 61 without.
	waitFor(t, "60 scrapes of the healthy target", func() bool { return good.hits.Load() >= 60 })
	if b, g := bad.hits.Load(), good.hits.Load(); b > g/3 {
		t.Fatalf("404 target scraped %d times while the healthy one was %d times", b, g)
	}
	bad.status.Store(http.StatusOK)
	waitFor(t, "the replica's first good scrape", func() bool { _, fr := s.Get("bad"); return fr == Fresh })
	b0, g0 := bad.hits.Load(), good.hits.Load()
	waitFor(t, "30 more scrapes of the healthy target", func() bool { return good.hits.Load() >= g0+30 })
	if b, g := bad.hits.Load()-b0, good.hits.Load()-g0; b < g/2 {
		t.Fatalf("after it answers, scraped %d times while the healthy one was %d times", b, g)
	}
}

// RefreshTargets scrapes the named targets only, and what is asked for
// between two rounds is merged into one round per MinRefresh.
func TestRefreshTargetsScrapesOnlyThoseNamed(t *testing.T) {
	a := newFakeReplica(t, vllmBody(0, 1, 0.1))
	b := newFakeReplica(t, vllmBody(0, 1, 0.1))
	c := newFakeReplica(t, vllmBody(0, 1, 0.1))
	s := New(Config{Interval: time.Hour, MinRefresh: time.Millisecond})
	s.SetTargets(map[string]string{"a": a.URL, "b": b.URL, "c": c.URL})
	run(t, s)
	waitFor(t, "the first scrapes", func() bool {
		_, fa := s.Get("a")
		_, fb := s.Get("b")
		_, fc := s.Get("c")
		return fa == Fresh && fb == Fresh && fc == Fresh
	})
	s.RefreshTargets("a")
	waitFor(t, "a refreshed", func() bool { return a.hits.Load() == 2 })
	s.RefreshTargets("b")
	waitFor(t, "b refreshed", func() bool { return b.hits.Load() == 2 })
	s.RefreshTargets() // nothing
	if na, nc := a.hits.Load(), c.hits.Load(); na != 2 || nc != 1 {
		t.Fatalf("scrapes of a %d (want 2: the first and its refresh), of c %d (want 1)", na, nc)
	}
}

func TestRefreshTargetsAreMergedToOneRoundPerMinRefresh(t *testing.T) {
	a := newFakeReplica(t, vllmBody(0, 1, 0.1))
	b := newFakeReplica(t, vllmBody(0, 1, 0.1))
	c := newFakeReplica(t, vllmBody(0, 1, 0.1))
	const gap = 100 * time.Millisecond
	s := New(Config{Interval: time.Hour, MinRefresh: gap})
	s.SetTargets(map[string]string{"a": a.URL, "b": b.URL, "c": c.URL})
	start := time.Now()
	run(t, s)
	waitFor(t, "the first scrapes", func() bool { return a.hits.Load() == 1 && b.hits.Load() == 1 })
	for i := 0; i < 100; i++ {
		s.RefreshTargets("a")
		s.RefreshTargets("b")
		time.Sleep(time.Millisecond)
	}
	waitFor(t, "a and b refreshed", func() bool { return a.hits.Load() >= 2 && b.hits.Load() >= 2 })
	elapsed := time.Since(start)
	max := 1 + int64(elapsed/gap) + 1
	for name, f := range map[string]*fakeReplica{"a": a, "b": b} {
		if n := f.hits.Load(); n > max {
			t.Errorf("%s: %d scrapes in %v, want at most %d (one per %v)", name, n, elapsed, max, gap)
		}
	}
	if n := c.hits.Load(); n != 1 {
		t.Errorf("c was never asked for but scraped %d times", n)
	}
}

// A target whose sample holds what its reader wants (Config.Settled: a
// cache size, fixed at the engine's start) is read every SettledInterval
// from then on, not every Interval; one that does not yet is read every
// Interval. The clock is the test's: each round is one tick.
func TestASettledTargetIsReadSeldom(t *testing.T) {
	sized := newFakeReplica(t, "vllm:num_requests_waiting 0\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n")
	unsized := newFakeReplica(t, "vllm:num_requests_waiting 0\nvllm:cache_config_info{num_gpu_blocks=\"None\"} 1\n")
	var now atomic.Int64
	start := time.Unix(1000, 0)
	now.Store(start.UnixNano())
	s := New(Config{Interval: time.Second, SettledInterval: 10 * time.Second,
		Settled: func(smp Sample) bool { return smp.Have.KVTokens }})
	s.now = func() time.Time { return time.Unix(0, now.Load()) }
	s.SetTargets(map[string]string{"sized": sized.URL, "unsized": unsized.URL})
	defer s.own.CloseIdleConnections()
	var sizedAt []int
	for i := range 25 {
		now.Store(start.Add(time.Duration(i) * time.Second).UnixNano())
		before := sized.hits.Load()
		scrapeOnce(s)
		if sized.hits.Load() > before {
			sizedAt = append(sizedAt, i)
		}
	}
	if want := []int{0, 10, 20}; !slices.Equal(sizedAt, want) {
		t.Fatalf("sized target read at ticks %v, want %v", sizedAt, want)
	}
	if n := unsized.hits.Load(); n != 25 {
		t.Fatalf("unsized target read %d times in 25 ticks, want every tick", n)
	}
	if v, _ := s.Get("sized"); v.KVTokens != 1600 {
		t.Fatalf("sized target's sample %+v", v)
	}
}

// The config is part of what health answers show (a policy's settings):
// it must encode as JSON whether or not Settled is set.
func TestConfigEncodesAsJSON(t *testing.T) {
	for _, c := range []Config{{}, {Settled: func(Sample) bool { return true }, SettledInterval: time.Minute}} {
		b, err := json.Marshal(c.WithDefaults())
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if !strings.Contains(string(b), `"Interval":1000000000`) {
			t.Fatalf("encoded config %s", b)
		}
	}
}
