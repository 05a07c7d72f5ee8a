package cacheaware

import (
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"
)

// A tree's key is a copy: a key cut from a client's long model name must
// not keep the whole name (up to max_body_bytes) alive for as long as the
// tree lives. A tree costs its text's runes against MaxTreeSize, one rune
// at least, so without the copy a one-character prompt with a 4 MiB model
// name pinned 4 MiB per distinct name, far past the configured bound.
func TestTreeKeyDoesNotPinTheModelName(t *testing.T) {
	r := New(Config{})
	r.SetReplicas([]string{"a"})
	long := strings.Repeat("m", 1<<20)
	r.Insert(long, "x", "a")
	start := uintptr(unsafe.Pointer(unsafe.StringData(long)))
	end := start + uintptr(len(long))
	pins := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		return p >= start && p < end
	}
	if len(r.trees) != 1 {
		t.Fatalf("%d trees, want 1", len(r.trees))
	}
	for key, root := range r.trees {
		if len(key) > maxModelBytes || !utf8.ValidString(key) {
			t.Fatalf("tree key of %d bytes", len(key))
		}
		if pins(key) || pins(r.roots[root]) {
			t.Fatalf("the tree's %d-byte key shares the client's %d-byte model name", len(key), len(long))
		}
	}
	if d := r.Pick(long, "x", nil); d.Addr != "a" || d.Reason != CacheHit {
		t.Fatalf("the long model name did not find its tree: %+v", d)
	}
}
