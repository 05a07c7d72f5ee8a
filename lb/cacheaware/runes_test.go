package cacheaware

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// runeCount counts as utf8.RuneCountInString does, invalid and short
// encodings included, wherever they fall against its 16-byte steps.
func TestRuneCountMatchesTheStandardLibrary(t *testing.T) {
	pieces := []string{"a", "é", "€", "😀", "\xff", "\x80", "\xe2\x82", "\xf0\x9f\x98", "\xed\xa0\x80", "\xc0\xaf", " "}
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		var b strings.Builder
		if r.IntN(2) == 0 { // a run of ASCII long enough for the fast path
			b.WriteString(strings.Repeat("x", r.IntN(40)))
		}
		for range r.IntN(12) {
			b.WriteString(pieces[r.IntN(len(pieces))])
			b.WriteString(strings.Repeat("y", r.IntN(20)))
		}
		s := b.String()
		if got, want := runeCount(s), utf8.RuneCountInString(s); got != want {
			t.Fatalf("runeCount(%q) = %d, want %d", s, got, want)
		}
	}
	// Every byte value at every place of a 40-byte ASCII string.
	for p := range 40 {
		for c := range 256 {
			s := []byte(strings.Repeat("z", 40))
			s[p] = byte(c)
			if got, want := runeCount(string(s)), utf8.RuneCountInString(string(s)); got != want {
				t.Fatalf("byte %#x at %d: %d, want %d", c, p, got, want)
			}
		}
	}
}

func FuzzRuneCount(f *testing.F) {
	f.Add("hello, world: a prompt of ASCII, then é€😀 and \xff\x80")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := runeCount(s), utf8.RuneCountInString(s); got != want {
			t.Fatalf("runeCount(%q) = %d, want %d", s, got, want)
		}
	})
}

func BenchmarkRuneCount4KB(b *testing.B) {
	s := strings.Repeat("You are a helpful assistant. ", 142)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		if runeCount(s) != len(s) {
			b.Fatal("miscounted ASCII")
		}
	}
}
