package redisleast

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// The pool's pick counter (member "n" of {tag}:picks) is outside input
// too: set to +inf (or a value so large that its first jump reads as an
// infinite rate), it made the other instances' pick rate NaN, and NaN
// never leaves an average: every view pick for the rest of the store's
// life (it outlives config reloads) went to a random candidate instead
// of the least loaded, even after the counter was put right.
func TestPickCounterBeyondBeliefDoesNotPoisonViewPicks(t *testing.T) {
	addr := testRedis(t)
	cfg := testConfig(t, addr)
	cfg.CallRate = 1_000_000 // every pick and release of this test is a call of its own
	s := newStore(t, cfg, "picksinf")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	c := raw(t, addr)
	if err := c.Do(ctx, c.B().Zadd().Key(s.k.picks).ScoreMember().ScoreMember(math.Inf(1), "n").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for range 3 { // each reply carries the counter at +inf
		sel(t, s, "a", "b").Release(ok)
	}
	// The operator puts the counter right.
	if err := c.Do(ctx, c.B().Del().Key(s.k.picks).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		sel(t, s, "a", "b").Release(ok)
	}
	held := sel(t, s, "a", "b") // its reply is the view: one replica busy, one idle
	defer held.Release(ok)
	idle := map[string]string{"a": "b", "b": "a"}[held.Addr]
	b := batcherOf(s)
	b.mu.Lock()
	defer b.mu.Unlock()
	rate := b.foreignRate
	for i := range 50 {
		if got := b.viewPickLocked([]string{"a", "b"}, i%2, time.Now()); got != idle {
			t.Fatalf("view pick %d went to %s, busy with %v, not to the idle %s (other instances' pick rate %v)",
				i, got, b.view, idle, rate)
		}
	}
}

// A select script that fails with an error reply after it counted the
// request (a foreign value of the wrong type at {tag}:insts) left the
// count and the record in Redis, while Select answered with a local
// lease that never releases them: the replica stayed busy by one for
// every such pick, even once the key was put right, until the instance
// died (with max_inflight: the pool shed for good).
func TestSelectFailingOnAForeignKeyLeavesNoCount(t *testing.T) {
	oneCallModes(t, testSelectFailingOnAForeignKeyLeavesNoCount)
}

func testSelectFailingOnAForeignKeyLeavesNoCount(t *testing.T, mode func(string) Config) {
	addr := testRedis(t)
	cfg := mode(addr)
	if cfg.MaxInflight == 0 {
		cfg.MaxInflight = 100
	}
	s := newStore(t, cfg, "foreign")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	c := raw(t, addr)
	if err := c.Do(ctx, c.B().Set().Key(s.k.insts).Value("not a set").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		l, err := s.Pick(ctx, &lb.Request{})
		if err != nil {
			t.Fatal(err)
		}
		l.Release(ok)
	}
	// The operator puts the key right.
	if err := c.Do(ctx, c.B().Del().Key(s.k.insts).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, s, map[string]int64{"a": 0})
}

// A flush that fails puts its releases back within pending_max; those
// beyond it were dropped without rotating the identity, which stays
// alive: their counts stayed up for the instance's life. Here pending_max
// is lowered (live) while five releases wait for a Redis that refuses
// them (the user lost access to a key the release script declares).
func TestReleasesFlushFailedBeyondPendingMaxAreNotLost(t *testing.T) {
	srv := privateRedis(t)
	admin := raw(t, srv.Addr)
	ctx := context.Background()
	acl := func(rules ...string) {
		t.Helper()
		args := append([]string{"on", ">pw", "+@all"}, rules...)
		if err := admin.Do(ctx, admin.B().AclSetuser().Username("u").Rule(args...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	acl("~*", "&*")
	cfg := exactConfig(t, srv.Addr)
	cfg.Username, cfg.Password = "u", "pw"
	cfg.LeaseTTL = 150 * time.Millisecond // a maintenance round (and its flush) every 50 ms
	cfg.PendingMax = 1000
	s := newStore(t, cfg, "putback")
	if err := s.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	var ls []*Lease
	for range 5 {
		ls = append(ls, sel(t, s, "a"))
	}
	tag := s.k.tag
	acl("resetkeys", "~"+tag+":load", "~"+tag+":insts", "~"+tag+":alive:*", "~"+tag+":inst:*") // not :gone
	for _, l := range ls {
		l.Release(ok)
	}
	if n := s.Stats().Pending; n != 5 {
		t.Fatalf("%d releases pending, want 5", n)
	}
	cfg.PendingMax = 2
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a flush beyond the new bound", func() bool { return s.Stats().Pending <= 2 })
	acl("~*")
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := s.Counts(ctx)
		if err == nil && c["a"] == 0 {
			return
		}
		if time.Now().After(deadline) { // only against a hang
			t.Fatalf("counts %v (%v), pending %d: releases were lost", c, err, s.Stats().Pending)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
