package loadaware

import "testing"

// batch is a batching engine with fresh metrics, n requests in flight of
// 1,000 tokens each, picked turn-th.
func batch(addr string, n int, turn uint64) Candidate {
	return Candidate{Addr: addr, MetricsFresh: true, Running: 16, Active: n, ActiveTokens: int64(n) * 1000,
		LastPick: turn, Pace: 0.004}
}

func picked(p *Policy, cs []Candidate) string {
	return cs[p.Rank(cs, RequestFacts{}).Order[0]].Addr
}

// Between batching engines loaded alike, the request goes to the one
// picked longest ago (as round robin spaces them), not to one that is a
// request lighter: that one would take two or three in a row, whose
// prefills share a step.
func TestBatchesLoadedAlikeTakeTurns(t *testing.T) {
	p := New(Config{})
	cs := []Candidate{batch("a", 16, 9), batch("b", 17, 3), batch("c", 17, 7), batch("d", 16, 8)}
	if got := picked(p, cs); got != "b" {
		t.Fatalf("picked %s, want b (within a request of the least, picked longest ago)", got)
	}
	for _, c := range cs {
		if !c.Even {
			t.Fatalf("%s not marked even: %+v", c.Addr, c)
		}
	}
	// Two requests more than the least: the exact count wins.
	cs = []Candidate{batch("a", 16, 9), batch("b", 18, 3), batch("c", 17, 7), batch("d", 16, 8)}
	if got := picked(p, cs); got != "c" {
		t.Fatalf("picked %s, want c: b carries 2 more than the least, c is the next picked longest ago", got)
	}
	// Next to an idle replica only idle ones are even.
	cs = []Candidate{batch("a", 0, 9), batch("b", 1, 3), batch("c", 0, 7)}
	if got := picked(p, cs); got != "c" {
		t.Fatalf("picked %s, want c (idle, picked before a)", got)
	}
	// As many requests, but one holds far more tokens: not even.
	cs = []Candidate{batch("a", 16, 9), batch("b", 16, 3), batch("c", 16, 7), batch("d", 16, 8)}
	cs[1].ActiveTokens *= 2
	if got := picked(p, cs); got != "c" {
		t.Fatalf("picked %s, want c: b holds twice the tokens", got)
	}
}

// A replica slower than the fastest by slowerPace or more is never even:
// on a mixed fleet the band would give the slow engines their turns.
func TestASlowerEngineIsNotEven(t *testing.T) {
	p := New(Config{})
	cs := []Candidate{batch("a", 16, 9), batch("slow", 17, 3), batch("c", 17, 7), batch("d", 16, 8)}
	cs[1].Pace = 1.5 * cs[0].Pace
	if got := picked(p, cs); got != "c" {
		t.Fatalf("picked %s, want c: slow is 1.5× slower", got)
	}
	// No pace yet (new replica): it may be even.
	cs[1].Pace = 0
	if got := picked(p, cs); got != "slow" {
		t.Fatalf("picked %s, want the replica without a pace yet (picked longest ago)", got)
	}
}

// No band for one-at-a-time replicas (their next request waits for the
// whole one before it), nor without every replica's metrics fresh.
func TestNoBandWithoutFreshBatches(t *testing.T) {
	p := New(Config{})
	single := []Candidate{batch("a", 1, 9), batch("b", 2, 3)}
	single[0].Running, single[1].Running = 1, 1
	if got := picked(p, single); got != "a" {
		t.Fatalf("one-at-a-time replicas: picked %s, want a (fewest in flight)", got)
	}
	cs := []Candidate{batch("a", 16, 9), batch("b", 17, 3), batch("c", 17, 7), batch("d", 16, 10)}
	cs[3].MetricsFresh = false
	if got := picked(p, cs); got != "a" {
		t.Fatalf("d's metrics stale: picked %s, want a (exact ranking: fewest in flight)", got)
	}
}
