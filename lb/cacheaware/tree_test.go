package cacheaware

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// check verifies every invariant the code relies on; tests call it after
// each step so a broken invariant fails at the step that broke it.
func check(t *testing.T, r *Router) {
	t.Helper()
	r.mu.RLock()
	defer r.mu.RUnlock()
	size, nodes, holdings := 0, 0, 0
	chars := map[*replica]int{}
	// Position of each holding in the global and replica lists.
	gpos := map[*holding]int{}
	i := 0
	for h := r.lru.gnext; h != &r.lru; h = h.gnext {
		if h.gnext.gprev != h {
			t.Fatalf("global list broken")
		}
		gpos[h] = i
		i++
	}
	rpos := map[*holding]int{}
	for _, rep := range r.replicas {
		j := 0
		for h := rep.lru.rnext; h != &rep.lru; h = h.rnext {
			if h.rep != rep || h.rnext.rprev != h {
				t.Fatalf("replica list of %s broken", rep.addr)
			}
			rpos[h] = j
			j++
		}
	}
	var walk func(n *node, root bool)
	walk = func(n *node, root bool) {
		checkKids(t, n)
		for kid := range n.allKids() {
			if kid.parent != n {
				t.Fatalf("bad parent pointer at %q", kid.label)
			}
			if kid.label == "" || !utf8.ValidString(kid.label) || int(kid.runes) != utf8.RuneCountInString(kid.label) {
				t.Fatalf("bad label %q (runes %d)", kid.label, kid.runes)
			}
			if f, _ := utf8.DecodeRuneInString(kid.label); f != kid.first {
				t.Fatalf("bad first rune for %q", kid.label)
			}
			if len(kid.holders) == 0 {
				t.Fatalf("node %q has no holder", kid.label)
			}
			size += int(kid.runes)
			nodes++
			for _, h := range kid.holders {
				holdings++
				if h.node != kid {
					t.Fatalf("holding points elsewhere")
				}
				if _, ok := gpos[h]; !ok {
					t.Fatalf("holding of %q not in global list", kid.label)
				}
				if !h.rep.dead {
					if _, ok := rpos[h]; !ok {
						t.Fatalf("holding of %q not in its replica list", kid.label)
					}
				}
				chars[h.rep] += int(kid.runes)
				if !root {
					ph := n.holdingOf(h.rep)
					if ph == nil {
						t.Fatalf("%s holds %q but not its parent %q", h.rep.addr, kid.label, n.label)
					}
					if gpos[ph] >= gpos[h] || (!h.rep.dead && rpos[ph] >= rpos[h]) {
						t.Fatalf("parent holding %q not ahead of child %q", n.label, kid.label)
					}
				}
			}
			walk(kid, false)
		}
	}
	names := 0
	for m, root := range r.trees {
		if r.roots[root] != m || len(root.kids) == 0 || len(root.holders) != 0 {
			t.Fatalf("bad root for model %q", m)
		}
		names += utf8.RuneCountInString(m) + 1
		walk(root, true)
	}
	if names != r.names || r.names > r.cfg.MaxTreeSize {
		t.Fatalf("model names cost %d, recorded %d, bound %d", names, r.names, r.cfg.MaxTreeSize)
	}
	if len(r.roots) != len(r.trees) {
		t.Fatalf("roots map out of sync")
	}
	if size != r.size || nodes != r.nodes || holdings != len(gpos) {
		t.Fatalf("size %d/%d nodes %d/%d holdings %d/%d (counted/recorded)", size, r.size, nodes, r.nodes, holdings, len(gpos))
	}
	if r.size > r.cfg.MaxTreeSize {
		t.Fatalf("size %d exceeds bound %d", r.size, r.cfg.MaxTreeSize)
	}
	for _, rep := range r.replicas {
		if chars[rep] != rep.chars {
			t.Fatalf("%s: chars %d, recorded %d", rep.addr, chars[rep], rep.chars)
		}
	}
}

// checkKids verifies how n keeps its children (kids.go): few sorted by
// distinct first rune, or many in a table where each is found by its
// first rune, within the load bounds.
func checkKids(t *testing.T, n *node) {
	t.Helper()
	if !n.wide() {
		for k, kid := range n.kids {
			if kid == nil || k > 0 && n.kids[k-1].first >= kid.first {
				t.Fatalf("children not sorted by distinct first rune under %q", n.label)
			}
		}
		return
	}
	size, count := cap(n.kids), 0
	for kid := range n.allKids() {
		count++
		if n.child(kid.first) != kid {
			t.Fatalf("child %q of %q not found in its table", kid.label, n.label)
		}
	}
	if size&(size-1) != 0 || size < minKidTable || count != len(n.kids) ||
		2*count > size || count <= maxSortedKids/2 || 8*count < size && size > minKidTable {
		t.Fatalf("table of %q: %d children (len %d) in %d slots", n.label, count, len(n.kids), size)
	}
}

func newRouter(t *testing.T, cfg Config, addrs ...string) *Router {
	t.Helper()
	if err := cfg.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	r := New(cfg)
	r.SetReplicas(addrs)
	return r
}

// holdersOf returns the addresses holding the longest match of text, and
// the match length in runes.
func holdersOf(r *Router, model, text string) (addrs []string, matched int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	root := r.trees[model]
	if root == nil {
		return nil, 0
	}
	n, m := match(root, text)
	if n == nil {
		return nil, 0
	}
	for _, rep := range r.order {
		if n.holdingOf(rep) != nil {
			addrs = append(addrs, rep.addr)
		}
	}
	return addrs, m
}

func TestInsertAndMatch(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b")
	r.Insert("m", "hello world", "a")
	check(t, r)
	got, m := holdersOf(r, "m", "hello there")
	if fmt.Sprint(got) != "[a]" || m != 6 {
		t.Fatalf("match = %v, %d; want [a], 6", got, m)
	}
	if got, m := holdersOf(r, "m", "goodbye"); got != nil || m != 0 {
		t.Fatalf("unrelated text matched %v, %d", got, m)
	}
	// A text that is a prefix of a stored one matches fully.
	if _, m := holdersOf(r, "m", "hello"); m != 5 {
		t.Fatalf("prefix matched %d, want 5", m)
	}
	if s := r.Stats(); s.Chars != 11 || s.ReplicaChars["a"] != 11 || s.ReplicaChars["b"] != 0 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestSharedPrefixStoredOnce(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b")
	sys := "You are a helpful assistant. "
	r.Insert("m", sys+"What is 2+2?", "a")
	r.Insert("m", sys+"Name a color.", "b")
	r.Insert("m", sys+"What is 3+3?", "b")
	check(t, r)
	got, m := holdersOf(r, "m", sys+"Tell me a joke")
	if fmt.Sprint(got) != "[a b]" || m != len(sys) {
		t.Fatalf("shared prefix held by %v, matched %d; want [a b], %d", got, m, len(sys))
	}
	got, m = holdersOf(r, "m", sys+"What is 3+4?")
	if fmt.Sprint(got) != "[b]" || m != len(sys)+10 {
		t.Fatalf("got %v, %d; want [b], %d", got, m, len(sys)+10)
	}
	// sys once + "What is 2+2?"'s divergent parts: "What is " + "2+2?" + "3+3?" + "Name a color."
	want := len(sys) + len("What is ") + 4 + 4 + len("Name a color.")
	s := r.Stats()
	if s.Chars != want {
		t.Fatalf("size = %d, want %d (shared text counted once)", s.Chars, want)
	}
	if s.ReplicaChars["a"] != len(sys)+12 || s.ReplicaChars["b"] != len(sys)+8+4+13 {
		t.Fatalf("replica chars = %v", s.ReplicaChars)
	}
}

func TestUnicodeCountsRunes(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b")
	r.Insert("m", "héllo wörld 日本語", "a")
	check(t, r)
	if s := r.Stats(); s.Chars != 15 {
		t.Fatalf("size = %d runes, want 15", s.Chars)
	}
	if _, m := holdersOf(r, "m", "héllo wörld 日本人"); m != 14 {
		t.Fatalf("matched %d runes, want 14", m)
	}
	// é (C3 A9) and è (C3 A8) share their first byte: the split must fall
	// on the rune boundary, not inside the rune.
	r.Insert("m", "aé", "a")
	r.Insert("m", "aè", "b")
	check(t, r)
	got, m := holdersOf(r, "m", "aè")
	if fmt.Sprint(got) != "[b]" || m != 2 {
		t.Fatalf("got %v, %d; want [b], 2", got, m)
	}
	if got, m := holdersOf(r, "m", "aê"); fmt.Sprint(got) != "[a b]" || m != 1 {
		t.Fatalf("got %v, %d; want [a b], 1", got, m)
	}
	// Invalid UTF-8 is made valid, not stored raw.
	r.Insert("m", "x\xffy", "a")
	check(t, r)
}

func TestEvictionIsLRU(t *testing.T) {
	r := newRouter(t, Config{MaxTreeSize: 30}, "a", "b", "c")
	A, B, C, D := "AAAAAAAAAA", "BBBBBBBBBB", "CCCCCCCCCC", "DDDDDDDDDD"
	r.Insert("m", A, "a")
	r.Insert("m", B, "b")
	r.Insert("m", C, "c")
	r.Insert("m", A, "a") // A is now the most recent
	r.Insert("m", D, "a") // over the bound: the least recent (B) goes
	check(t, r)
	for _, x := range []struct {
		text string
		kept bool
	}{{A, true}, {B, false}, {C, true}, {D, true}} {
		_, m := holdersOf(r, "m", x.text)
		if (m == 10) != x.kept {
			t.Fatalf("%s kept = %v, want %v", x.text[:1], m == 10, x.kept)
		}
	}
	if s := r.Stats(); s.EvictedChars != 10 || s.Chars != 30 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestEvictionIsLeafFirst(t *testing.T) {
	r := newRouter(t, Config{MaxTreeSize: 20}, "a")
	r.Insert("m", "PPPPPxxxxx", "a")
	r.Insert("m", "PPPPPyyyyy", "a") // 15 chars stored; P shared
	r.Insert("m", "PPPPPxxxxx", "a") // x leaf now newer than y
	r.Insert("m", "zzzzzzz", "a")    // 22 > 20: evict the y leaf, not P
	check(t, r)
	if _, m := holdersOf(r, "m", "PPPPPxxxxx"); m != 10 {
		t.Fatalf("x branch matched %d, want 10", m)
	}
	if _, m := holdersOf(r, "m", "PPPPPyyyyy"); m != 5 {
		t.Fatalf("y branch matched %d, want 5 (prefix kept, leaf gone)", m)
	}
}

func TestTextLongerThanBoundIsCut(t *testing.T) {
	r := newRouter(t, Config{MaxTreeSize: 8}, "a")
	r.Insert("m", "0123", "a")
	r.Insert("m", "日本語日本語日本語日本語", "a")
	check(t, r)
	if _, m := holdersOf(r, "m", "日本語日本語日本語日本語"); m != 8 {
		t.Fatalf("matched %d, want 8 (cut to the bound)", m)
	}
}

// After every insert of a random sequence (shared prefixes, multi-byte
// runes, several models and replicas, replica churn), the invariants hold
// and the size is within the bound.
func TestBoundNeverExceededRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("ab日é")
	prefixes := []string{"", "system prompt one: ", "système deux: ", "三番目: "}
	for _, max := range []int{1, 7, 50, 300} {
		r := newRouter(t, Config{MaxTreeSize: max}, "r0", "r1", "r2")
		for i := 0; i < 1500; i++ {
			var sb strings.Builder
			sb.WriteString(prefixes[rng.IntN(len(prefixes))])
			for range rng.IntN(25) {
				sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
			}
			model := fmt.Sprint("m", rng.IntN(3))
			r.Insert(model, sb.String(), fmt.Sprint("r", rng.IntN(4))) // r3 unknown until added
			check(t, r)
			switch rng.IntN(50) {
			case 0:
				r.SetReplicas([]string{"r0", "r2", "r3"})
				check(t, r)
			case 1:
				r.SetReplicas([]string{"r0", "r1", "r2"})
				check(t, r)
			case 2:
				r.EvictOnce()
				check(t, r)
				if s := r.Stats(); s.Chars > max-max/8 {
					t.Fatalf("EvictOnce left %d chars, low water %d", s.Chars, max-max/8)
				}
			}
		}
	}
}

func TestRemovedReplicaLeavesTree(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b")
	sys := "shared system prompt "
	r.Insert("m", sys+"only a", "a")
	r.Insert("m", sys+"only b, longer", "b")
	r.Insert("m2", "b alone in another model", "b")
	before := r.Stats().Chars
	r.SetReplicas([]string{"a"})
	check(t, r)
	s := r.Stats()
	if want := before - len("b, longer") - len("b alone in another model"); s.Chars != want {
		t.Fatalf("size after removal = %d, want %d", s.Chars, want)
	}
	if _, ok := s.ReplicaChars["b"]; ok || s.Models != 1 {
		t.Fatalf("stats after removal = %+v", s)
	}
	if got, m := holdersOf(r, "m", sys+"only b, longer"); fmt.Sprint(got) != "[a]" || m != len(sys)+5 {
		t.Fatalf("after removal: %v, %d", got, m)
	}
	// Re-added, b starts empty.
	r.SetReplicas([]string{"a", "b"})
	if c := r.Stats().ReplicaChars["b"]; c != 0 {
		t.Fatalf("re-added replica holds %d chars", c)
	}
	// Inserts for a removed address are ignored.
	r.SetReplicas([]string{"a"})
	r.Insert("m", "late text", "b")
	check(t, r)
	if _, m := holdersOf(r, "m", "late text"); m != 0 {
		t.Fatalf("insert for a removed replica was stored")
	}
}

func TestConcurrentUse(t *testing.T) {
	r := newRouter(t, Config{MaxTreeSize: 2000}, "a", "b", "c", "d")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	runDone := make(chan struct{})
	go func() { r.Run(ctx); close(runDone) }()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 2000 {
				text := fmt.Sprintf("prefix %d / %d", rng.IntN(10), rng.IntN(1000))
				d := r.Pick("m", text, func(string) (int, bool) { return rng.IntN(3), true })
				if d.Addr != "" {
					r.Insert("m", text, d.Addr)
				}
				switch {
				case g == 0 && i%200 == 0:
					r.SetReplicas([]string{"a", "b", "c", "d"}[:1+i/200%4])
				case g == 1 && i%300 == 0:
					r.EvictOnce()
				case g == 2 && i%100 == 0:
					_ = r.Stats()
				}
			}
		}()
	}
	wg.Wait()
	check(t, r)
	cancel()
	<-runDone // Run returns when ctx ends
}
