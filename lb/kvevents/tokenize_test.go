package kvevents

import (
	"hash/fnv"
	"math/rand"
	"regexp"
	"slices"
	"testing"
)

// The sim's rule as the sim writes it: the reference for SimTokenizer.
var simTokenRE = regexp.MustCompile(`(\{|\}|:|,|-|\.|\?|\!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|\-|_|~|/|\\|>|<|\[|\]|=|"|'|\w+)(\s*)`)

func simReference(text string) []uint32 {
	var out []uint32
	for _, w := range simTokenRE.FindAllString(text, -1) {
		h := fnv.New32a()
		h.Write([]byte(w))
		out = append(out, h.Sum32())
	}
	return out
}

func TestSimTokenizerMatchesTheRegexp(t *testing.T) {
	texts := []string{
		"Hello, world! How's it going?  {x: [1, 2]}\ta-b_c /path\\n",
		"_lead __double foo_bar  trailing\n\n", "naïve café — 東京 ok\v\u00a0x",
		"a\x00b\xffc", "   ", "!!!", "x\r\n\fy",
	}
	r := rand.New(rand.NewSource(1))
	alphabet := []rune("ab_Z09 \t\n\f\r\v{}:,-.?!;@#$%^&*()+~/\\><[]=\"'|`é東\u00a0")
	for i := 0; i < 2000; i++ {
		n := r.Intn(40)
		rs := make([]rune, n)
		for j := range rs {
			rs[j] = alphabet[r.Intn(len(alphabet))]
		}
		texts = append(texts, string(rs))
	}
	for _, text := range texts {
		got, _ := SimTokenizer{}.Tokenize("m", text)
		if want := simReference(text); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("%q: got %v, want %v", text, got, want)
		}
	}
}
