package caddymodule

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A module with a small body bound must not decide for a later module
// with a larger one: the later one reads further and parses the prompt,
// and the replica still receives the body unchanged.
func TestALargerBodyBoundReadsFurther(t *testing.T) {
	body := `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `","max_tokens":7}`
	r, _, _ := newRequest(t)
	r.URL.Path = "/v1/completions"
	r.Body = io.NopCloser(strings.NewReader(body))

	small := requestInfoFor(r, 100, true) // e.g. flow_control with max_body_bytes 100
	if small.Parsed {
		t.Fatal("a 2 KB body parsed within a 100-byte bound")
	}
	large := requestInfoFor(r, 1<<20, true) // then a policy with the default bound
	if !large.Parsed || large.Model != "m" || large.MaxTokens != 7 {
		t.Fatalf("the larger bound did not read further: %+v", large.Request)
	}
	if large.estimatedTokens() != int64(large.PromptTokens)+7 {
		t.Fatalf("estimate %d", large.estimatedTokens())
	}
	got, _ := io.ReadAll(r.Body)
	if string(got) != body {
		t.Fatalf("the replica would get %d bytes, want the %d sent", len(got), len(body))
	}
	// Each attempt gets its own copy of a body read whole (a retry resends it).
	for i := 0; i < 2; i++ {
		large.bodyFor(r)
		if got, _ := io.ReadAll(r.Body); string(got) != body {
			t.Fatalf("attempt %d sends %d bytes", i, len(got))
		}
	}
}

func TestUnparsedBodyIsEstimatedConservatively(t *testing.T) {
	r, _, _ := newRequest(t)
	r.Method = http.MethodPost
	r.URL.Path = "/v1/completions"
	r.Body = io.NopCloser(strings.NewReader("not json"))
	if got := requestInfoFor(r, 1<<20, true).estimatedTokens(); got != assumedRequestTokens {
		t.Fatalf("unparsed body estimated at %d tokens, want %d", got, assumedRequestTokens)
	}
}

// A request without max_tokens is weighed at the output its engine will
// allow: vLLM (and OpenAI) stop a completion at 16 tokens, so a
// completions request weighed at 256 held 240 tokens of a token gate it
// never used; a chat runs to the end of the context, and its answer is
// assumed as long as most are.
func TestOutputTokensAssumedFollowTheEndpoint(t *testing.T) {
	for _, c := range []struct {
		path, body string
		out        int64
	}{
		{"/v1/completions", `{"prompt":"` + strings.Repeat("x", 400) + `"}`, 16},
		{"/v1/completions", `{"prompt":[1,2,3],"max_tokens":null}`, 16},
		{"/v1/completions", `{"prompt":"hi","max_tokens":100}`, 100},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 400) + `"}]}`, 256},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9}`, 9},
	} {
		r, _, _ := newRequest(t)
		r.Method = http.MethodPost
		r.URL.Path = c.path
		r.Body = io.NopCloser(strings.NewReader(c.body))
		ri := requestInfoFor(r, 1<<20, true)
		if !ri.Parsed {
			t.Fatalf("%s %s: not parsed", c.path, c.body)
		}
		if got, want := ri.estimatedTokens(), int64(ri.PromptTokens)+c.out; got != want {
			t.Errorf("%s %s: estimated %d tokens, want %d (the prompt's %d and %d of output)", c.path, c.body, got, want, ri.PromptTokens, c.out)
		}
	}
}

// A client's huge max_tokens must not make its request weigh more than
// any model could serve (it closed the token gate for everyone).
func TestTokenEstimateIsCapped(t *testing.T) {
	r, _, _ := newRequest(t)
	r.URL.Path = "/v1/completions"
	r.Body = io.NopCloser(strings.NewReader(`{"prompt":"hi","max_tokens":9223372036854775807}`))
	ri := requestInfoFor(r, 1<<20, true)
	if !ri.Parsed {
		t.Fatal("not parsed")
	}
	if got := ri.estimatedTokens(); got != maxEstimatedTokens {
		t.Fatalf("estimate %d, want the cap %d", got, maxEstimatedTokens)
	}
}

type closeCount struct {
	io.Reader
	closed int
}

func (c *closeCount) Close() error { c.closed++; return nil }

// Whatever the Content-Length says (exact, unknown, a promise of more
// than is sent), the replica receives the body byte for byte, Close
// reaches the client's body, and an announced size is not allocated on
// trust beyond 64 KiB.
func TestBodyPassesThroughWhateverTheContentLength(t *testing.T) {
	small := `{"model":"m","prompt":"hi","max_tokens":3}`
	big := `{"model":"m","prompt":"` + strings.Repeat("y", 5000) + `"}`
	for _, c := range []struct {
		name   string
		body   string
		cl     int64
		max    int64
		parsed bool
	}{
		{"exact length", small, int64(len(small)), 1 << 20, true},
		{"unknown length", small, -1, 1 << 20, true},
		{"over the bound, known length", big, int64(len(big)), 1000, false},
		{"over the bound, unknown length", big, -1, 1000, false},
		{"announces 1 GiB", big, 1 << 30, 1 << 20, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, _, _ := newRequest(t)
			r.URL.Path = "/v1/completions"
			orig := &closeCount{Reader: strings.NewReader(c.body)}
			r.Body, r.ContentLength = orig, c.cl
			ri := requestInfoFor(r, c.max, true)
			if ri.Parsed != c.parsed {
				t.Fatalf("parsed %v, want %v", ri.Parsed, c.parsed)
			}
			if cap(ri.buf) > 64<<10+len(c.body) {
				t.Fatalf("buffer of %d bytes for a %d-byte body", cap(ri.buf), len(c.body))
			}
			got, err := io.ReadAll(r.Body)
			if err != nil || string(got) != c.body {
				t.Fatalf("replica gets %d bytes (%v), want the %d sent", len(got), err, len(c.body))
			}
			r.Body.Close()
			if orig.closed != 1 {
				t.Fatalf("client body closed %d times", orig.closed)
			}
		})
	}
}

// A caller that only weighs the prompt (flow_control's token mode,
// load_aware's default scorers) gets its counts without its text; a later
// caller on the same request that routes on the text (cache_aware behind
// flow_control) gets the text, and the counts do not change.
func TestTheTextIsRenderedForTheCallerThatReadsIt(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("be brief. ", 300) +
		`"},{"role":"user","content":"hi"}],"max_tokens":9}`
	r, _, _ := newRequest(t)
	r.URL.Path = "/v1/chat/completions"
	r.Body = io.NopCloser(strings.NewReader(body))

	weighed := requestInfoFor(r, 1<<20, false)
	if !weighed.Parsed || weighed.Text != "" || weighed.Model != "m" || weighed.MaxTokens != 9 || len(weighed.Messages) != 2 {
		t.Fatalf("weighed: parsed %t, text %d bytes, %+v", weighed.Parsed, len(weighed.Text), weighed.Request)
	}
	tokens := weighed.estimatedTokens()
	read := requestInfoFor(r, 1<<20, true)
	if !strings.Contains(read.Text, "be brief. be brief.") || !strings.HasSuffix(read.Text, "hi\n") {
		t.Fatalf("the caller that reads the text got %q", read.Text)
	}
	if read.estimatedTokens() != tokens {
		t.Fatalf("the estimate moved from %d to %d with the text", tokens, read.estimatedTokens())
	}
	// A later weighing keeps the text rendered.
	if again := requestInfoFor(r, 1<<20, false); again.Text != read.Text {
		t.Fatal("a later weighing dropped the text")
	}
	if got, _ := io.ReadAll(r.Body); string(got) != body {
		t.Fatalf("the replica would get %d bytes, want the %d sent", len(got), len(body))
	}
}

// A body that does not parse fails alike weighed or read: it is not parsed
// again for the text.
func TestABodyThatFailsToParseIsNotParsedAgainForItsText(t *testing.T) {
	r, _, _ := newRequest(t)
	r.URL.Path = "/v1/chat/completions"
	r.Body = io.NopCloser(strings.NewReader(`{"messages":"not a list"}`))
	if requestInfoFor(r, 1<<20, false).Parsed || requestInfoFor(r, 1<<20, true).Parsed {
		t.Fatal("a chat body whose messages are a string parsed")
	}
}
