package kvevents

import (
	"strings"
	"testing"
	"time"
)

// Another instance's routing decision counts as held by its replica for
// what is left of SpeculateFor after it was made, as this instance's own
// do; an old one, or one made unknown when, changes nothing.
func TestPeerDecisionCountsAsJustRouted(t *testing.T) {
	ix := NewIndex(Config{})
	now := t0
	px := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}, Now: func() time.Time { return now }}
	text := strings.Repeat("word ", 64)
	tokens, _ := SimTokenizer{}.Tokenize("m", text)
	keys := ix.Keys(tokens)
	held := func(addr string) int {
		m, f := make([]int, 1), make([]bool, 1)
		ix.MatchFresh(keys, []string{addr}, now, 30*time.Second, m, f)
		return m[0]
	}
	px.SpeculatePeer("m", text, "b", now.Add(-5*time.Second)) // too old
	px.SpeculatePeer("m", text, "c", time.Time{})             // when unknown
	if held("b") != 0 || held("c") != 0 {
		t.Fatalf("stale peer decisions speculated: b %d, c %d", held("b"), held("c"))
	}
	px.SpeculatePeer("m", text, "a", now.Add(-500*time.Millisecond))
	if got := held("a"); got != len(keys) || got == 0 {
		t.Fatalf("a holds %d of %d blocks after a peer routed there", got, len(keys))
	}
	now = now.Add(1600 * time.Millisecond) // 2.1 s after the decision
	if got := held("a"); got != 0 {
		t.Fatalf("the peer's speculation outlived SpeculateFor from its decision: %d", got)
	}
}
