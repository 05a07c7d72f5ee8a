package bench

import (
	"encoding/json"
	"testing"
	"time"
)

// TestHeavyMixScript checks the heavy-short-mix workload's shape: the two
// heavy seeds, the burst from 300 ms, a heavy one after every 50 with its
// extra gap, the request classes' sizes, and determinism.
func TestHeavyMixScript(t *testing.T) {
	s := heavyMixScript(400)
	if len(s) != 400 {
		t.Fatalf("%d requests, want 400", len(s))
	}
	if s[0].at != 0 || s[1].at != 50*time.Millisecond || s[0].class != "heavy" || s[1].class != "heavy" {
		t.Fatalf("seeds: %v %s, %v %s", s[0].at, s[0].class, s[1].at, s[1].class)
	}
	if s[2].at != 300*time.Millisecond {
		t.Fatalf("burst starts at %v", s[2].at)
	}
	outTokens := map[string][2]int{"short": {25, 40}, "medium": {60, 90}, "heavy": {320, 1050}}
	count := map[string]int{}
	for i, m := range s {
		count[m.class]++
		var b struct {
			Prompt    string `json:"prompt"`
			MaxTokens int    `json:"max_tokens"`
		}
		if err := json.Unmarshal([]byte(m.body), &b); err != nil {
			t.Fatal(err)
		}
		r, ok := outTokens[m.class]
		if !ok || b.MaxTokens < r[0] || b.MaxTokens > r[1] {
			t.Errorf("request %d (%s): max_tokens %d", i, m.class, b.MaxTokens)
		}
		if i >= 3 {
			gap := m.at - s[i-1].at
			want := [2]time.Duration{7 * time.Millisecond, 13 * time.Millisecond}
			if s[i-1].class == "heavy" {
				want = [2]time.Duration{67 * time.Millisecond, 73 * time.Millisecond}
			}
			if gap < want[0] || gap > want[1] {
				t.Errorf("gap before request %d: %v, want %v", i, gap, want)
			}
		}
	}
	// Burst position 50, 101, … (every 51st) is a heavy one: 7 in 398.
	if count["heavy"] != 2+7 || count["short"]+count["medium"] != 400-9 {
		t.Errorf("classes: %v", count)
	}
	again := heavyMixScript(400)
	for i := range s {
		if s[i] != again[i] {
			t.Fatalf("not deterministic at %d", i)
		}
	}
	if q := heavyMixScript(120); len(q) != 120 || q[52].class != "heavy" {
		t.Errorf("quick script: %d requests, request 52 is %s", len(q), q[52].class)
	}
}
