package cacheaware

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// namesHeld is what the trees' names hold: each tree's key runes plus one
// for its root, the unit max_tree_size charges a tree.
func namesHeld(r *Router) (trees, runes int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for key := range r.trees {
		runes += utf8.RuneCountInString(key) + 1
	}
	return len(r.trees), runes
}

// Any client picks the "model" string, so distinct names must not grow
// the trees past max_tree_size: one-character prompts under 100-character
// names made a tree each, every one holding its name and root, while only
// the prompts' characters counted (1,000,000 names took ~480 MB with the
// default bound). Each tree now costs its name against the bound, and the
// trees of names no longer used are evicted, LRU, with their text.
func TestModelNamesCountAgainstMaxTreeSize(t *testing.T) {
	const max = 1000
	r := newRouter(t, Config{MaxTreeSize: max}, "a", "b")
	for i := range 5000 {
		name := fmt.Sprintf("%0100d", i)
		r.Insert(name, "x", "a")
		if trees, runes := namesHeld(r); runes > max {
			t.Fatalf("after %d distinct model names: %d trees whose names hold %d characters, max_tree_size %d",
				i+1, trees, runes, max)
		}
	}
	check(t, r)
	// The most recent names are the ones kept.
	last := fmt.Sprintf("%0100d", 4999)
	if d := r.Pick(last, "x", nil); d.Addr != "a" || d.Reason != CacheHit {
		t.Fatalf("the newest model's tree is gone: %+v", d)
	}
	if d := r.Pick(fmt.Sprintf("%0100d", 0), "x", nil); d.Reason == CacheHit {
		t.Fatalf("the oldest model's tree is still there: %+v", d)
	}
}

// A flood of one-off names evicts, LRU, the trees nobody uses any more;
// a model in use keeps its tree and its text, and once the flood's trees
// are evicted the pool holds only what is used.
func TestAFloodOfModelNamesLeavesTheModelsInUse(t *testing.T) {
	const max = 4000
	r := newRouter(t, Config{MaxTreeSize: max}, "a", "b")
	sys := strings.Repeat("a shared system prompt. ", 20) // 480 chars
	for i := range 3000 {
		if i%50 == 0 { // the real model, in steady use
			r.Insert("llama", sys+"question "+fmt.Sprint(i), "b")
		}
		r.Insert(fmt.Sprint("junk-", i, strings.Repeat("z", 60)), "hi", "a")
	}
	check(t, r)
	if d := r.Pick("llama", sys+"another question", nil); d.Addr != "b" || d.Reason != CacheHit {
		t.Fatalf("the model in use lost its text: %+v", d)
	}
	if trees, runes := namesHeld(r); runes > max {
		t.Fatalf("%d trees whose names hold %d characters, max_tree_size %d", trees, runes, max)
	}
	// Dropping the replica that served the flood leaves one tree.
	r.SetReplicas([]string{"b"})
	check(t, r)
	if s := r.Stats(); s.Models != 1 {
		t.Fatalf("%d models' trees left, want 1 (llama)", s.Models)
	}
}

// A name alone longer than the bound cannot get a tree (it would pass the
// bound by itself); the insert is ignored and nothing breaks.
func TestAModelNameLongerThanTheBoundGetsNoTree(t *testing.T) {
	r := newRouter(t, Config{MaxTreeSize: 10}, "a")
	r.Insert("m", "0123456789", "a") // a small name fits as before
	r.Insert(strings.Repeat("n", 20), "x", "a")
	check(t, r)
	if trees, runes := namesHeld(r); trees != 1 || runes != 2 {
		t.Fatalf("%d trees holding %d name characters, want 1 and 2 (only m)", trees, runes)
	}
	if d := r.Pick("m", "0123456789", nil); d.Reason != CacheHit || d.MatchedChars != 10 {
		t.Fatalf("m lost its text: %+v", d)
	}
}
