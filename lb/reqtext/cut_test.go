package reqtext

import (
	"reflect"
	"strings"
	"testing"
)

// Text is cut at MaxTextBytes as the encoding/json reference cuts it
// (whole decoded strings, on a rune boundary), though the scanner appends
// a string piece by piece: escapes, surrogate pairs, lone surrogates and
// invalid bytes (U+FFFD) straddling the cut, in a string array and chat
// content parts.
func TestCutMatchesReferenceAtEveryOffset(t *testing.T) {
	if testing.Short() {
		t.Skip("a few hundred 1 MiB bodies")
	}
	tails := []string{`\u00e9`, `\ud83d\ude00`, `\ud800`, "\xff\xfe", "\xe6\x97\xa5", "é日😀", `\n\/`, "\xe6\x97", "\xed\xa0\x80"}
	for _, pad := range []int{MaxTextBytes - 4, MaxTextBytes - 2, MaxTextBytes - 1} {
		for _, tail := range tails {
			s := strings.Repeat("a", pad) + strings.Repeat(tail, 3)
			for _, c := range []struct{ path, body string }{
				{"/v1/completions", `{"prompt":["x","` + s + `",null,"y"]}`},
				{"/v1/chat/completions", `{"messages":[{"role":"` + tail + `","content":[{"type":"text","text":"` + s[5:] +
					`"},{"type":"image_url"},{"type":"text","text":"` + tail + `"}]}]}`},
			} {
				got, gerr := Extract(c.path, []byte(c.body))
				want, werr := refExtract(c.path, []byte(c.body))
				if gerr != nil || werr != nil {
					t.Fatalf("pad %d, tail %q, %s: errors %v, %v", pad, tail, c.path, gerr, werr)
				}
				got.Messages = nil
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("pad %d, tail %q, %s: truncated %v/%v, %d/%d text bytes, %d/%d tokens (got/want)",
						pad, tail, c.path, got.Truncated, want.Truncated, len(got.Text), len(want.Text), got.PromptTokens, want.PromptTokens)
				}
			}
		}
	}
}
