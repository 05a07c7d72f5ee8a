package cacheaware

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A client-chosen model name is a tree key: it is bounded and valid, and
// a request with the same (long) name still finds its tree.
func TestModelNamesAreBoundedKeys(t *testing.T) {
	r := New(Config{})
	r.SetReplicas([]string{"a", "b"})
	long := strings.Repeat("m", 1<<20) + "\xff"
	r.Insert(long, "a shared system prompt", "b")
	for key := range r.trees {
		if len(key) > maxModelBytes || !utf8.ValidString(key) {
			t.Fatalf("tree key of %d bytes, valid %v", len(key), utf8.ValidString(key))
		}
	}
	if d := r.Pick(long, "a shared system prompt, then a question", nil); d.Addr != "b" || d.Reason != CacheHit {
		t.Fatalf("the long model name did not find its tree: %+v", d)
	}
}
