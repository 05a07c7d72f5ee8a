package reqtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// commonPrefix is the number of leading bytes a and b share.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// A prompt of token ids and a text prompt that spells them are different
// prompts to the engine ("1 2 3" tokenizes into other ids than 1, 2, 3):
// they must not share a prefix in the tree, which keys on Text.
func TestTokenIDsAndTheirDigitsAreDifferentPrompts(t *testing.T) {
	for _, c := range []struct{ path, ids, text string }{
		{"/v1/completions", `{"prompt":[1,2,3]}`, `{"prompt":"1 2 3"}`},
		{"/v1/completions", `{"prompt":[[1,2],[3]]}`, `{"prompt":["1 2","3"]}`},
		{"/v1/completions", `{"prompt":[1,2,3]}`, `{"prompt":["1 2 3"]}`},
		{"/generate", `{"input_ids":[101,2054]}`, `{"text":"101 2054"}`},
	} {
		ids, text := mustExtract(t, c.path, c.ids), mustExtract(t, c.path, c.text)
		if !ids.TokenIDs || text.TokenIDs {
			t.Fatalf("%s: TokenIDs %v and %v", c.path, ids.TokenIDs, text.TokenIDs)
		}
		if n := commonPrefix(ids.Text, text.Text); n > 0 {
			t.Errorf("%s %s and %s share the prefix %q (texts %q, %q)", c.path, c.ids, c.text, ids.Text[:n], ids.Text, text.Text)
		}
	}
}

// The ids stay readable: the first prompt's ids are the fields of Text's
// first line (lb/kvevents splits them with strings.Fields), and prompts
// sharing leading ids share a text prefix.
func TestTokenIDsTextKeepsIDsAndPrefixes(t *testing.T) {
	req := mustExtract(t, "/v1/completions", `{"prompt":[[7,-0,42],[9]]}`)
	first, _, _ := strings.Cut(req.Text, "\n")
	if got := strings.Join(strings.Fields(first), ","); got != "7,0,42" {
		t.Errorf("fields of the first line %q: %s, want 7,0,42", first, got)
	}
	a := mustExtract(t, "/generate", `{"input_ids":[1,2,3,4]}`)
	b := mustExtract(t, "/generate", `{"input_ids":[1,2,3,99]}`)
	if n := commonPrefix(a.Text, b.Text); !strings.HasSuffix(a.Text[:n], "1 2 3 ") {
		t.Errorf("shared prefix %q of %q and %q, want it to end with the ids 1 2 3", a.Text[:n], a.Text, b.Text)
	}
}

// No text prompt renders as a prompt of ids, even one that starts with
// the mark; and texts that start with the mark or its escape stay apart.
func TestNoTextStartsWithTheTokenIDsMark(t *testing.T) {
	ids := mustExtract(t, "/v1/completions", `{"prompt":[1,2,3]}`)
	seen := map[string]string{}
	for _, prompt := range []string{"1 2 3", TokenIDsMark + "1 2 3", markEscape + TokenIDsMark + "1 2 3",
		markEscape + "1 2 3", markEscape + markEscape + "1 2 3", "x" + TokenIDsMark, TokenIDsMark, markEscape, ""} {
		for _, body := range []string{`{"prompt":` + quote(prompt) + `}`, `{"prompt":[` + quote(prompt) + `,"y"]}`} {
			req := mustExtract(t, "/v1/completions", body)
			if req.TokenIDs || strings.HasPrefix(req.Text, TokenIDsMark) || commonPrefix(req.Text, ids.Text) > 0 {
				t.Errorf("%s renders as %q, like the ids' %q", body, req.Text, ids.Text)
			}
			if other, ok := seen[req.Text]; ok {
				t.Errorf("%s and %s both render as %q", body, other, req.Text)
			}
			seen[req.Text] = body
			if want := (len(prompt) + len("\ny")*strings.Count(body, `"y"`) + 3) / 4; req.PromptTokens != want {
				t.Errorf("%s: %d prompt tokens, want %d (the escape is not prompt)", body, req.PromptTokens, want)
			}
		}
	}
}

// The mark does not take Text past MaxTextBytes: ids, or a text with the
// escape, are cut to make room for it.
func TestMarkedTextIsCutAtMaxTextBytes(t *testing.T) {
	ids := strings.TrimSuffix(strings.Repeat("7,", MaxTextBytes/2), ",") // MaxTextBytes-1 bytes of "7 7 ..."
	text := markEscape + strings.Repeat("é", MaxTextBytes/2)
	for _, c := range []struct{ name, body string }{
		{"ids", `{"prompt":[` + ids + `]}`},
		{"escaped text", `{"prompt":` + quote(text) + `}`},
	} {
		req := mustExtract(t, "/v1/completions", c.body)
		if len(req.Text) > MaxTextBytes || !req.Truncated || !utf8.ValidString(req.Text) {
			t.Errorf("%s: %d bytes of text, truncated %v, valid UTF-8 %v", c.name, len(req.Text), req.Truncated, utf8.ValidString(req.Text))
		}
	}
}
