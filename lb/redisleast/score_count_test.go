package redisleast

import (
	"context"
	"math"
	"testing"
)

// A count in Redis is outside input: a score an operator, another
// instance or an older version left at +inf (or past what a float counts
// exactly) is the busiest replica there is, as the script's own least pick
// reads it, not the idlest. Converted as it came, +inf became
// math.MinInt64: Counts reported it, and every pick from the view went to
// that replica.
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
	l := sel(t, s, "a", "b", "c") // the script picks b; its reply is the view
	defer l.Release(ok)
	if l.Addr != "b" {
		t.Fatalf("the script picked %s, want b", l.Addr)
	}
	b := batcherOf(s)
	b.mu.Lock()
	view := b.view
	b.mu.Unlock()
	if !(view["a"] > view["b"] && view["c"] > view["b"]) {
		t.Fatalf("view %v: a (+inf) and c (1e300) must read busier than b (1)", view)
	}
}
