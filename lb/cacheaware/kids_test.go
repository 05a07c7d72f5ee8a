package cacheaware

import (
	"math/rand/v2"
	"testing"
)

// A node's children, added and removed at random through every form
// (sorted, tables growing and shrinking, back to sorted), stay exactly
// the ones added: each found by its first rune, none else.
func TestKidsAddRemoveRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	runes := distinctRunes(3000)
	n := &node{}
	want := map[rune]*node{}
	for step := range 40_000 {
		// Phases that mostly add and mostly remove, so the count sweeps
		// from none to thousands and back.
		adding := step/5000%2 == 0
		c := runes[rng.IntN(len(runes))]
		if k := want[c]; k != nil {
			if !adding || rng.IntN(4) == 0 {
				n.removeKid(k)
				delete(want, c)
			}
		} else if adding || rng.IntN(4) == 0 {
			k := newNode(string(c)+"x", n)
			n.addKid(k)
			want[c] = k
		}
		if len(n.kids) != len(want) {
			t.Fatalf("step %d: %d children, want %d", step, len(n.kids), len(want))
		}
		if len(want) < 40 || step%500 == 0 {
			checkKids(t, n)
			for c, k := range want {
				if n.child(c) != k {
					t.Fatalf("step %d: child %q not found", step, c)
				}
			}
			for k := range n.allKids() {
				if want[k.first] != k {
					t.Fatalf("step %d: stray child %q", step, k.label)
				}
			}
		}
		if got := n.child(runes[rng.IntN(len(runes))]); got != nil && want[got.first] != got {
			t.Fatalf("step %d: lookup returned a stray child", step)
		}
	}
}

// Replacing a child (as split does) keeps it findable in either form.
func TestReplaceKid(t *testing.T) {
	for _, width := range []int{3, 100} {
		n := &node{}
		for _, c := range distinctRunes(width) {
			n.addKid(newNode(string(c)+"old", n))
		}
		for _, c := range distinctRunes(width) {
			p := newNode(string(c), n)
			n.replaceKid(n.child(c), p)
			if n.child(c) != p {
				t.Fatalf("width %d: replaced child %q not found", width, c)
			}
		}
		checkKids(t, n)
	}
}
