package cacheaware

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Picks, inserts of prompts that share prefixes and parts of multi-byte
// runes, replica churn, reloads that shrink and grow max_tree_size, and
// the periodic trim, all at once: every pick names a replica of the set
// it was made in (never a removed one), and once they stop the tree's
// invariants hold, no removed replica holds text, and the size is within
// the bound in force.
func TestChurnKeepsTheTreeWhole(t *testing.T) {
	r := newRouter(t, Config{MaxTreeSize: 400}, "a", "b", "c")
	sets := [][]string{{"a", "b", "c"}, {"b", "c", "d"}, {"a", "d"}, {"c"}, {"a", "b", "c", "d"}}
	// Runes whose UTF-8 forms share leading bytes: é/è (C3 A9/A8), 日/旦
	// (E6 97 A5/A6), 😀/😁 (F0 9F 98 80/81).
	alphabet := []rune("ab éè日旦😀😁")
	prefixes := []string{"", "system: ", "système: ", "日本語の指示: ", "😀😀😀 "}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan struct{})
	go func() { r.Run(ctx); close(runDone) }()
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 33))
			for range 3000 {
				var sb strings.Builder
				sb.WriteString(prefixes[rng.IntN(len(prefixes))])
				for range rng.IntN(30) {
					sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
				}
				text, model := sb.String(), fmt.Sprint("m", rng.IntN(3))
				d := r.Pick(model, text, func(string) (int, bool) { return rng.IntN(4), rng.IntN(8) > 0 })
				if d.Addr == "" {
					continue
				}
				if !slices.ContainsFunc(sets, func(s []string) bool { return slices.Contains(s, d.Addr) }) {
					t.Errorf("picked %q, in no set", d.Addr)
				}
				r.Insert(model, text, d.Addr)
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			r.SetReplicas(sets[i%len(sets)])
		}
	})
	wg.Go(func() {
		for i := range 100 {
			r.Configure(Config{MaxTreeSize: []int{400, 60, 1000, 7}[i%4], EvictionInterval: 1})
		}
	})
	wg.Wait()
	cancel()
	<-runDone
	check(t, r)
	final := r.Addrs()
	r.mu.RLock()
	var walk func(n *node)
	walk = func(n *node) {
		for kid := range n.allKids() {
			for _, h := range kid.holders {
				if !slices.Contains(final, h.rep.addr) || h.rep.dead {
					t.Errorf("%s (dead %v) still holds %q; the set is %v", h.rep.addr, h.rep.dead, kid.label, final)
				}
			}
			walk(kid)
		}
	}
	for _, root := range r.trees {
		walk(root)
	}
	r.mu.RUnlock()
	if s := r.Stats(); s.Chars > s.MaxChars || s.MaxChars != 7 {
		t.Fatalf("%d chars, bound %d (want 7, the last reload's)", s.Chars, s.MaxChars)
	}
}
