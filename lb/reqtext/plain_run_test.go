package reqtext

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// plainRunEndByByte is the byte-at-a-time loop plainRunEnd replaces.
func plainRunEndByByte(b []byte, i int) int {
	for ; i < len(b) && !stringSpecial[b[i]]; i++ {
	}
	return i
}

// Every byte value at every position of a word and of the tail, among
// fillers on both sides of each test's edges (0x1f/0x20, '"' ± 1,
// '\\' ± 1, high bytes), from several starts.
func TestPlainRunEndFindsEveryByteAnywhere(t *testing.T) {
	fillers := []byte{'a', ' ', '!', '#', '[', ']', 0x7f, 0x80, 0xa2, 0xdc, 0xff}
	for _, fill := range fillers {
		for n := 0; n <= 20; n++ {
			b := make([]byte, n)
			for p := 0; p < n; p++ {
				for c := range 256 {
					for j := range b {
						b[j] = fill
					}
					b[p] = byte(c)
					for _, start := range []int{0, 1, p, p + 1} {
						if start > n {
							continue
						}
						if got, want := plainRunEnd(b, start), plainRunEndByByte(b, start); got != want {
							t.Fatalf("fill %#x, len %d, byte %#x at %d, from %d: %d, want %d", fill, n, c, p, start, got, want)
						}
					}
				}
			}
		}
	}
}

// Two special bytes in one word: the first is found, whatever the second
// (a match's borrow may mark bytes above it, never below).
func TestPlainRunEndFindsTheFirstOfTwo(t *testing.T) {
	specials := []byte{0, 0x01, 0x1f, '"', '\\'}
	near := []byte{0x20, 0x21, '!', '#', '[', ']', 0xff, 0x80}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		b := make([]byte, 1+r.IntN(40))
		for j := range b {
			b[j] = near[r.IntN(len(near))]
		}
		for range 1 + r.IntN(3) {
			b[r.IntN(len(b))] = specials[r.IntN(len(specials))]
		}
		start := r.IntN(len(b) + 1)
		if got, want := plainRunEnd(b, start), plainRunEndByByte(b, start); got != want {
			t.Fatalf("%q from %d: %d, want %d", b, start, got, want)
		}
	}
}

// BenchmarkPlainRunEnd4KB: the word loop against the byte loop it
// replaced, over 4 KB of plain text.
func BenchmarkPlainRunEnd4KB(b *testing.B) {
	text := []byte(strings.Repeat("You are a helpful assistant. ", 142))
	for _, f := range []struct {
		name string
		end  func([]byte, int) int
	}{{"words", plainRunEnd}, {"bytes", plainRunEndByByte}} {
		b.Run(f.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if f.end(text, 0) != len(text) {
					b.Fatal("found a special byte in plain text")
				}
			}
		})
	}
}
