package redisleast

import (
	"context"
	"testing"
	"time"
)

// An instance's version (field "!" of its hash) is outside input too: at
// 2^53 or more (or inf, nan) adding 1 no longer changes it in Lua, so
// every reply read as Redis losing writes and the maintenance loop ran
// reconcile after reconcile without a pause, against Redis, for good.
// The instance takes a fresh identity instead, and the loop stays idle.
func TestVersionBeyondBeliefDoesNotSpinTheLoop(t *testing.T) {
	for _, v := range []string{"9007199254740992", "9007199254740993", "1e300", "inf", "nan"} {
		t.Run(v, func(t *testing.T) { testVersionBeyondBeliefDoesNotSpinTheLoop(t, v) })
	}
}

func testVersionBeyondBeliefDoesNotSpinTheLoop(t *testing.T, version string) {
	addr := testRedis(t)
	cfg := exactConfig(t, addr)
	cfg.LeaseTTL = time.Hour // no round of its own: every round the loop runs is a wake-up
	s := newStore(t, cfg, "version")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	c := raw(t, addr)
	if err := c.Do(ctx, c.B().Hset().Key(s.ident.Load().inst).FieldValue().FieldValue("!", version).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second reply is at or below the first
		sel(t, s, "a").Release(ok)
	}
	// Every Redis call from here on is the test's own, unless the loop runs.
	calls := s.Stats().ScriptCount
	const rounds = 10
	for range rounds {
		sel(t, s, "a").Release(ok)
	}
	if n := s.Stats().ScriptCount - calls; n != 2*rounds {
		t.Fatalf("%d Redis calls during %d picks and releases: the maintenance loop ran %d of them (version %s)",
			n, rounds, n-2*rounds, version)
	}
	if s.own.stale.Load() {
		t.Fatal("the instance still takes Redis for having lost its writes")
	}
	wantCounts(t, s, map[string]int64{"a": 0})
}
