package redisleast

import (
	"context"
	"maps"
	"math"
	"testing"
)

// A count in Redis is outside input: a score an operator, another
// instance or an older version left at +inf (or past what a float counts
// exactly) is the busiest replica there is to Counts, as to a script
// until it counts the replica again (recount.go), not the idlest.
// Converted as it came, +inf became math.MinInt64: Counts reported it,
// and every pick from the view went to that replica.
func TestScoresBeyondBeliefCountAsTheBusiest(t *testing.T) {
	srv := privateRedis(t)
	s := newStore(t, testConfig(t, srv.Addr), "inf")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	c := raw(t, srv.Addr)
	zadd := c.B().Zadd().Key(s.k.load).ScoreMember().ScoreMember(math.Inf(1), "a").ScoreMember(1e300, "c").Build()
	if err := c.Do(ctx, zadd).Error(); err != nil {
		t.Fatal(err)
	}
	counts, err := s.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !(counts["a"] > counts["b"] && counts["c"] > counts["b"]) {
		t.Fatalf("counts %v: a (+inf) and c (1e300) must read busier than b (0)", counts)
	}
	// The script counts a and c again (no request is recorded on them); its
	// reply is the view.
	l := sel(t, s, "a", "b", "c")
	defer l.Release(ok)
	b := batcherOf(s)
	b.mu.Lock()
	view := maps.Clone(b.view)
	b.mu.Unlock()
	want := map[string]int64{"a": 0, "b": 0, "c": 0}
	want[l.Addr] = 1
	if !maps.Equal(view, want) {
		t.Fatalf("view %v, want %v (the pick on %s, a and c counted again)", view, want, l.Addr)
	}
}
