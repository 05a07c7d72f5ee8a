package redisleast

import (
	"context"
	"maps"
	"math"
	"strconv"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// corruptScores are counts no script leaves: the scripts' arithmetic
// kept them as they were (-inf + 1 is -inf, +inf - 1 is +inf), or took
// them below zero (a fraction), so the replica stayed the idlest (past
// max_inflight) or the busiest for good.
var corruptScores = []float64{math.Inf(-1), math.Inf(1), -1e15, 1e300, 0.5}

// plantScore sets member's score in the sorted set key, as an operator,
// a foreign client or an older version could.
func plantScore(t *testing.T, c rueidis.Client, key, member string, score float64) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().Zadd().Key(key).ScoreMember().ScoreMember(score, member).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// rawScores is the sorted set key as Redis holds it, so a fraction or an
// infinity shows (Counts reads them as counts).
func rawScores(t *testing.T, c rueidis.Client, key string) map[string]float64 {
	t.Helper()
	zs, err := c.Do(context.Background(), c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, z := range zs {
		out[z.Member] = z.Score
	}
	return out
}

func wantRawScores(t *testing.T, c rueidis.Client, key string, want map[string]float64) {
	t.Helper()
	if got := rawScores(t, c, key); !maps.Equal(got, want) {
		t.Fatalf("%s = %v, want %v", key, got, want)
	}
}

// A corrupt count of a busy replica is counted again from the records:
// the next pick goes to the idle replica (the busy one is at
// max_inflight), and once both requests end both counts are 0.
func TestCorruptScoreIsCountedAgain(t *testing.T) {
	oneCallModes(t, func(t *testing.T, mode func(string) Config) {
		for _, score := range corruptScores {
			t.Run(strconv.FormatFloat(score, 'g', -1, 64), func(t *testing.T) {
				testCorruptScoreIsCountedAgain(t, mode, score)
			})
		}
	})
}

func testCorruptScoreIsCountedAgain(t *testing.T, mode func(string) Config, score float64) {
	addr := testRedis(t)
	cfg := mode(addr)
	cfg.MaxInflight = 1
	s := newStore(t, cfg, "corrupt")
	if err := s.Sync(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	busy := sel(t, s, "a", "b")
	idle := map[string]string{"a": "b", "b": "a"}[busy.Addr]
	c := raw(t, addr)
	plantScore(t, c, s.k.load, busy.Addr, score)
	next := sel(t, s, "a", "b")
	if next.Addr != idle {
		t.Fatalf("with %s's count at %v (one request), the next pick went to it, not to the idle %s", busy.Addr, score, idle)
	}
	busy.Release(ok)
	next.Release(ok)
	wantRawScores(t, c, s.k.load, map[string]float64{"a": 0, "b": 0})
}

// In batches the release is what meets the corrupt count: it must come
// back to 0 with the last request.
func TestCorruptScoreIsCountedAgainByABatchedRelease(t *testing.T) {
	addr := testRedis(t)
	s := newStore(t, testConfig(t, addr), "corruptbatch")
	if err := s.Sync(context.Background(), []string{"a"}); err != nil {
		t.Fatal(err)
	}
	l := sel(t, s, "a")
	c := raw(t, addr)
	waitFor(t, "the batched pick to reach Redis", func() bool { return rawScores(t, c, s.k.load)["a"] == 1 })
	plantScore(t, c, s.k.load, "a", math.Inf(-1))
	l.Release(ok)
	waitFor(t, "a's count back to 0", func() bool { return rawScores(t, c, s.k.load)["a"] == 0 })
}

// A busy replica removed from the set takes its count to gone: an
// infinite one stayed there for good (inf - 1 is inf), and came back
// with the replica if it was added again.
// On a Cluster too: the recount reaches the instances' hashes by names
// built in the script, in the pool's slot.
func TestCorruptScoreOfARemovedReplicaIsCountedAgain(t *testing.T) {
	redistest.Each(t, testCorruptScoreOfARemovedReplicaIsCountedAgain)
}

func testCorruptScoreOfARemovedReplicaIsCountedAgain(t *testing.T, tg redistest.Target) {
	cfg := confFor(t, tg)
	cfg.CallRate = -1 // one call per pick and release
	s := newStore(t, cfg, "corruptgone")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	l := sel(t, s, "a")
	c := rawFor(t, tg)
	plantScore(t, c, s.k.load, "a", math.Inf(1))
	if err := s.Sync(ctx, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	wantRawScores(t, c, s.k.gone, map[string]float64{"a": 1})
	l.Release(ok)
	wantRawScores(t, c, s.k.gone, map[string]float64{})
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	wantRawScores(t, c, s.k.load, map[string]float64{"a": 0, "b": 0})
}

// The queue hands a freed slot to the least loaded member: one at -inf
// was given every waiter, past max_inflight, with or without replicas
// the waiter must avoid.
func TestCorruptScoreDoesNotDivertTheQueue(t *testing.T) {
	for name, members := range map[string][]string{"no avoid": {"a", "b"}, "avoid": {"a", "b", "c"}} {
		t.Run(name, func(t *testing.T) { testCorruptScoreDoesNotDivertTheQueue(t, members) })
	}
}

func testCorruptScoreDoesNotDivertTheQueue(t *testing.T, members []string) {
	addr := testRedis(t)
	s := newStore(t, queueConfig(t, addr), "corruptqueue")
	ctx := context.Background()
	if err := s.Sync(ctx, members); err != nil {
		t.Fatal(err)
	}
	var held []*Lease
	for _, m := range members {
		held = append(held, sel(t, s, m))
	}
	c := raw(t, addr)
	out := make(chan got, 1)
	enqueue(t, ctx, c, s, "w", out, "a", "b")
	plantScore(t, c, s.k.load, "a", math.Inf(-1))
	held[1].Release(ok) // b's slot is free; a is still busy
	g := <-out
	if g.err != nil {
		t.Fatal(g.err)
	}
	if g.l.Addr != "b" {
		t.Fatalf("the waiter was handed %s (its count at -inf, one request), not the free b", g.l.Addr)
	}
	g.l.Release(ok)
	want := map[string]float64{}
	for i, m := range members {
		if i != 1 {
			held[i].Release(ok)
		}
		want[m] = 0
	}
	wantRawScores(t, c, s.k.load, want)
}
