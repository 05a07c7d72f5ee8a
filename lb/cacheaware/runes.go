package cacheaware

import "unicode/utf8"

// runeCount is utf8.RuneCountInString (an invalid or short encoding counts
// as one rune a byte), with a fast path over ASCII: the standard library's
// walks a string a byte at a time, and counting a 4 KB prompt's runes was
// over a third of a cache-aware pick (BenchmarkPick4KB). Prompts are mostly
// ASCII; this takes sixteen ASCII bytes a step and decodes the rest.
func runeCount(s string) int {
	const highs = 0x8080808080808080
	n := 0
	for i := 0; i < len(s); {
		if i+16 <= len(s) {
			w := s[i : i+16]
			if (le64(w)|le64(w[8:]))&highs == 0 {
				i, n = i+16, n+16
				continue
			}
		}
		if s[i] < utf8.RuneSelf {
			i, n = i+1, n+1
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i, n = i+size, n+1
	}
	return n
}

// le64 is s's first eight bytes as a little-endian word (the compiler
// makes it one load).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
