package cacheaware

import (
	"fmt"
	"strings"
	"testing"
)

func loads(m map[string]int) LoadFunc { return func(a string) (int, bool) { return m[a], true } }

func TestPickThreshold(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b")
	r.Insert("m", "abcdefghij", "a")
	busyA := loads(map[string]int{"a": 5}) // balanced (diff <= 32), a busier

	d := r.Pick("m", "abcdefXXXX", busyA) // 6/10 > 0.5
	if d.Addr != "a" || d.Reason != CacheHit || d.MatchedChars != 6 || d.MatchRate != 0.6 {
		t.Fatalf("above threshold: %+v", d)
	}
	d = r.Pick("m", "abcdeXXXXX", busyA) // 5/10 = 0.5: not above
	if d.Addr != "b" || d.Reason != Miss || d.MatchedChars != 5 {
		t.Fatalf("at threshold: %+v", d)
	}
	d = r.Pick("m", "", busyA)
	if d.Reason != Miss || d.MatchRate != 0 {
		t.Fatalf("empty text: %+v", d)
	}
	if s := r.Stats(); s.Hits != 1 || s.Misses != 2 || s.Imbalanced != 0 {
		t.Fatalf("counters = %+v", s)
	}
}

func TestPickImbalanceNeedsBothConditions(t *testing.T) {
	r := newRouter(t, Config{BalanceRelThreshold: 2}, "a", "b")
	text := "the same long prompt"
	r.Insert("m", text, "a")
	for _, c := range []struct {
		name   string
		la, lb int
		want   string
		reason Reason
	}{
		{"both hold", 100, 40, "b", Imbalance},            // diff 60 > 32, 100 > 80
		{"abs only", 100, 60, "a", CacheHit},              // diff 40 > 32, 100 <= 120
		{"rel only", 30, 0, "a", CacheHit},                // diff 30 <= 32, 30 > 0
		{"neither", 10, 9, "a", CacheHit},                 //
		{"imbalanced other way", 40, 100, "a", Imbalance}, // least loaded happens to hold it
	} {
		d := r.Pick("m", text, loads(map[string]int{"a": c.la, "b": c.lb}))
		if d.Addr != c.want || d.Reason != c.reason {
			t.Errorf("%s: got %s (%s), want %s (%s)", c.name, d.Addr, d.Reason, c.want, c.reason)
		}
	}
}

func TestPickMissPolicies(t *testing.T) {
	for _, c := range []struct {
		policy string
		want   string
	}{
		{MissSmallestTree, "b"}, // fewest chars, though busier
		{MissLeastLoad, "c"},
		{"", "c"}, // default
	} {
		r := newRouter(t, Config{MissPolicy: c.policy}, "a", "b", "c")
		r.Insert("m", strings.Repeat("a", 100), "a")
		r.Insert("m", strings.Repeat("b", 10), "b")
		r.Insert("m", strings.Repeat("c", 50), "c")
		d := r.Pick("m", "something new", loads(map[string]int{"a": 2, "b": 3, "c": 1}))
		if d.Addr != c.want || d.Reason != Miss {
			t.Errorf("miss_policy %q: got %+v, want %s", c.policy, d, c.want)
		}
	}
	// smallest_tree ties go to the less loaded replica.
	r := newRouter(t, Config{MissPolicy: MissSmallestTree}, "a", "b", "c")
	r.Insert("m", "xxxx", "a")
	if d := r.Pick("m", "new", loads(map[string]int{"b": 2, "c": 1})); d.Addr != "c" {
		t.Fatalf("smallest_tree tie: got %s, want c", d.Addr)
	}
}

func TestPickTiesGoToLessLoaded(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b", "c")
	text := "a prompt both a and b have"
	r.Insert("m", text, "a")
	r.Insert("m", text, "b")
	for _, c := range []struct {
		l    map[string]int
		want string
	}{
		{map[string]int{"a": 2, "b": 1}, "b"},
		{map[string]int{"a": 1, "b": 2}, "a"},
	} {
		if d := r.Pick("m", text, loads(c.l)); d.Addr != c.want || d.Reason != CacheHit {
			t.Fatalf("loads %v: got %+v, want %s", c.l, d, c.want)
		}
	}
	// Equal loads: the rotation spreads picks over the tied replicas.
	seen := map[string]int{}
	for range 10 {
		seen[r.Pick("m", text, nil).Addr]++
	}
	if seen["a"] != 5 || seen["b"] != 5 {
		t.Fatalf("equal ties not rotated: %v", seen)
	}
	// A miss among equally loaded replicas goes to the smallest tree (c
	// holds nothing): new prefixes spread over the caches.
	for range 3 {
		if d := r.Pick("m", "unmatched", nil); d.Addr != "c" || d.Reason != Miss {
			t.Fatalf("miss with equal loads: got %+v, want the smallest tree c", d)
		}
	}
	// Less load still comes first.
	if d := r.Pick("m", "unmatched", loads(map[string]int{"c": 1})); d.Addr == "c" {
		t.Fatalf("miss went to the loaded replica c: %+v", d)
	}
	// Equal loads and trees: misses rotate.
	r = newRouter(t, Config{}, "a", "b", "c")
	seen = map[string]int{}
	for range 9 {
		seen[r.Pick("m", "unmatched", nil).Addr]++
	}
	if seen["a"] != 3 || seen["b"] != 3 || seen["c"] != 3 {
		t.Fatalf("equal misses not rotated: %v", seen)
	}
}

// Misses spread new prefixes by the trees when loads are equal: four
// instances sharing their inserts (as through Redis), taking new prompts
// in turn, put 2 of 8 on each of 4 replicas, whatever their rotations.
// Before, each went by its own turn, and instances whose turns were in
// step sent their first prefixes to the same replica.
func TestMissesSpreadPrefixesOverTheTrees(t *testing.T) {
	for _, seeds := range [][4]uint64{{0, 0, 0, 0}, {5, 5, 5, 5}, {0, 1, 2, 3}, {3, 7, 7, 1}} {
		var inst []*Router
		for _, seed := range seeds {
			r := newRouter(t, Config{}, "a", "b", "c", "d")
			r.SeedTurns(seed)
			inst = append(inst, r)
		}
		per := map[string]int{}
		for i := range 8 {
			text := fmt.Sprintf("system prompt %d: %s", i, strings.Repeat("x", 100))
			d := inst[i%len(inst)].Pick("m", text, nil)
			for _, r := range inst {
				r.Insert("m", text, d.Addr)
			}
			per[d.Addr]++
		}
		for _, a := range []string{"a", "b", "c", "d"} {
			if per[a] != 2 {
				t.Fatalf("seeds %v: prefixes per replica %v, want 2 each", seeds, per)
			}
		}
	}
}

func TestPickModelsSeparated(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b")
	text := "identical prompt text"
	r.Insert("llama", text, "a")
	busyA := loads(map[string]int{"a": 1})
	if d := r.Pick("llama", text, busyA); d.Addr != "a" || d.Reason != CacheHit {
		t.Fatalf("same model: %+v", d)
	}
	if d := r.Pick("qwen", text, busyA); d.Addr != "b" || d.Reason != Miss || d.MatchedChars != 0 {
		t.Fatalf("other model: %+v", d)
	}
}

func TestPickNoReplicas(t *testing.T) {
	r := New(Config{})
	if d := r.Pick("m", "x", nil); d.Addr != "" || d.Reason != NoReplicas {
		t.Fatalf("no replicas: %+v", d)
	}
	r.SetReplicas([]string{"a"})
	r.Insert("m", "x", "a")
	r.SetReplicas(nil)
	if d := r.Pick("m", "x", nil); d.Addr != "" || r.Stats().Chars != 0 {
		t.Fatalf("after removing all: %+v, %+v", d, r.Stats())
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	d := Config{CacheThreshold: -1, BalanceAbsThreshold: -1}.WithDefaults()
	if d.CacheThreshold != 0 || d.BalanceAbsThreshold != 0 {
		t.Fatalf("explicit zeros: %+v", d)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{CacheThreshold: 1.5}, "cache_threshold must be in [0,1]"},
		{Config{BalanceRelThreshold: 0.5}, "balance_rel_threshold"},
		{Config{MaxTreeSize: -3}, "max_tree_size"},
		{Config{EvictionInterval: -1}, "eviction_interval"},
		{Config{MissPolicy: "random"}, "miss_policy"},
	} {
		err := c.cfg.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want it to name %q", c.cfg, err, c.want)
		}
	}
}

func TestConfigureShrinksTree(t *testing.T) {
	r := newRouter(t, Config{}, "a")
	for i := range 100 {
		r.Insert("m", strings.Repeat(string(rune('A'+i%26)), 1+i%7)+strings.Repeat("x", 50)+string(rune(i)), "a")
	}
	r.Configure(Config{MaxTreeSize: 200})
	check(t, r)
	if s := r.Stats(); s.Chars > 200 || s.MaxChars != 200 {
		t.Fatalf("after shrinking: %+v", s)
	}
}

func TestPickSkipsUnusableReplicas(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b", "c")
	text := "a long shared system prompt and a question"
	r.Insert("m", text, "a")
	aDown := func(addr string) (int, bool) {
		if addr == "a" {
			return 0, false
		}
		return map[string]int{"b": 3, "c": 1}[addr], true
	}
	if d := r.Pick("m", text, aDown); d.Reason != Miss || d.Addr != "c" {
		t.Fatalf("holder down: got %+v, want a least-load miss on c", d)
	}
	// An unusable replica's load does not count toward imbalance either.
	idleDown := func(addr string) (int, bool) {
		if addr == "c" {
			return 0, false
		}
		return 100, true
	}
	if d := r.Pick("m", text, idleDown); d.Reason != CacheHit || d.Addr != "a" {
		t.Fatalf("imbalance against a down replica: got %+v", d)
	}
	none := func(string) (int, bool) { return 0, false }
	if d := r.Pick("m", text, none); d.Addr != "" || d.Reason != NoUsable {
		t.Fatalf("all down: %+v", d)
	}
}
