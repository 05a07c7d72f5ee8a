package loadaware

import (
	"context"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

func TestRankGivesEqualTotalsToTheReplicaPickedLongestAgo(t *testing.T) {
	p := New(Config{})
	cs := []Candidate{{Addr: "a", LastPick: 7}, {Addr: "b", LastPick: 3}, {Addr: "c", LastPick: 9}, {Addr: "d", Active: 1}}
	for range 50 {
		if got := p.Rank(cs, RequestFacts{}).Order[0]; got != 1 {
			t.Fatalf("equal totals picked %s, want b (picked longest ago)", cs[got].Addr)
		}
	}
}

// With the defaults, requests over replicas loaded alike take turns as
// round robin spaces them: no replica gets two in a row while the others
// carry as many (a batching engine takes newcomers best one at a time).
// Broken at random, the same replica got two in a row about once every
// four requests.
func TestEqualReplicasTakeTurns(t *testing.T) {
	p := NewPicker(PickerConfig{})
	p.SetReplicas([]string{"a:1", "b:1", "c:1", "d:1"})
	var held []lb.Lease
	prev, repeats := "", 0
	for range 400 {
		l, err := p.Pick(context.Background(), &lb.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Replica() == prev {
			repeats++
		}
		prev = l.Replica()
		held = append(held, l)
	}
	if repeats > 0 {
		t.Fatalf("400 requests over 4 equal replicas: %d went to the replica that got the one before", repeats)
	}
	for _, l := range held {
		l.Release(lb.Outcome{Kind: lb.Cancelled})
	}
}
