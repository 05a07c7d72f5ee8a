package reqtext

import (
	"strings"
	"testing"
)

// A string is decoded in one pass: every byte of it is scanned for the
// next escape a bounded number of times. Each invalid byte (U+FFFD) used
// to start a new scan of the whole rest of the string, so a prompt of
// invalid UTF-8 cost time quadratic in its size: 256 KiB of "\xff" took
// 0.7 s, a 4 MiB body (the default bound) minutes of CPU per request.
// Counted, not timed: the bytes indexByte looks at.
func TestInvalidUTF8IsDecodedInLinearWork(t *testing.T) {
	scanned := 0
	defer func(f func([]byte, byte) int) { indexByte = f }(indexByte)
	orig := indexByte
	indexByte = func(b []byte, c byte) int {
		i := orig(b, c)
		if i < 0 {
			scanned += len(b)
		} else {
			scanned += i + 1
		}
		return i
	}
	const n = 1 << 14
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"` + strings.Repeat("\xff", n) + `"}`},
		{"/v1/completions", `{"prompt":["` + strings.Repeat("a\xff", n/2) + `"]}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + strings.Repeat("\xe6\x97", n/2) + `x\n"}]}`},
		{"/v1/chat/completions", `{"model":"` + strings.Repeat("\xff\\n", n/3) + `","messages":[{"content":[{"type":"text","text":"` + strings.Repeat("ab\xc0", n/3) + `"}]}]}`},
		{"/generate", `{"text":"` + strings.Repeat("\xed\xa0\x80", n/3) + `"}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","name":"` + strings.Repeat("\xff", n/2) + `","content":[{"type":"image_url","image_url":{"url":"` +
			strings.Repeat("a\xff", n/4) + `"}},{"type":"text","text":"x"}]}]}`},
	} {
		scanned = 0
		req, err := Extract(c.path, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if req.Text == "" {
			t.Fatalf("%s: no text", c.path)
		}
		if scanned > 2*len(c.body) {
			t.Errorf("%s: a %d-byte body: %d bytes scanned for escapes", c.path, len(c.body), scanned)
		}
	}
}
