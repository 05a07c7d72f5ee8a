package caddymodule

import (
	"io"
	"math"
	"strings"
	"testing"
)

// A Content-Length of 2⁶³-1 is one net/http accepts (it parses the
// header as a 63-bit number). Reading the body must neither panic nor
// allocate on the strength of it, and the replica gets the body as sent.
func TestHugeContentLengthDoesNotPanic(t *testing.T) {
	body := `{"model":"m","prompt":"hi"}`
	r, _, _ := newRequest(t)
	r.URL.Path = "/v1/completions"
	r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), math.MaxInt64
	var ri *requestInfo
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Fatalf("reading a body announced at %d bytes panicked: %v", int64(math.MaxInt64), v)
			}
		}()
		ri = requestInfoFor(r, 1<<20, true)
	}()
	if !ri.Parsed || ri.Model != "m" {
		t.Fatalf("not parsed: %+v", ri.Request)
	}
	if cap(ri.buf) > 64<<10+len(body) {
		t.Fatalf("buffer of %d bytes for a %d-byte body", cap(ri.buf), len(body))
	}
	if got, err := io.ReadAll(r.Body); err != nil || string(got) != body {
		t.Fatalf("replica gets %q (%v), want %q", got, err, body)
	}
}

// Two Sluice readers with different bounds (flow_control's max_body_bytes
// below the policy's) on a body between them: the first puts a replay of
// what it read on the client's request, the second (on reverse_proxy's
// copy) reads the rest. The client's request must still give the body
// as sent, for a handle_errors reverse_proxy to a fallback: it gave the
// first reader's prefix followed by the whole body again (custom_router
// keeps the body and replays it once read whole), or by nothing.
func TestEveryReplayGivesTheBodyAfterALargerBoundReadFurther(t *testing.T) {
	body := `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`
	for _, kept := range []bool{true, false} {
		r, _, _ := newRequest(t)
		r.URL.Path = "/v1/completions"
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), -1
		if kept {
			keepClientBody(r) // custom_router in front
		}
		if requestInfoFor(r, 100, true).Parsed { // flow_control, max_body_bytes 100
			t.Fatal("parsed over the bound")
		}
		proxied := r.WithContext(r.Context())      // reverse_proxy's copy shares the body
		ri := requestInfoFor(proxied, 1<<20, true) // the policy, default bound
		if !ri.Parsed {
			t.Fatal("not parsed within the larger bound")
		}
		ri.bodyFor(proxied)
		if got, _ := io.ReadAll(proxied.Body); string(got) != body {
			t.Fatalf("kept %v: the attempt sends %d bytes, want %d", kept, len(got), len(body))
		}
		// The attempt failed (a dial error): handle_errors proxies the
		// client's request to a fallback.
		if got, _ := io.ReadAll(r.Body); string(got) != body {
			t.Fatalf("kept %v: the fallback gets %d bytes, want the %d sent", kept, len(got), len(body))
		}
	}
}

// A body Sluice cannot parse weighed 512 tokens whatever its size, so a
// client passed flow control's token gate (and load_aware's active
// tokens) with any prompt by making the body one Sluice does not read
// and the engine does: a NaN field (Python's json takes it), a float
// max_tokens (pydantic takes 100.0), a body over max_body_bytes. An
// inference call's body is weighed at least by its size (4 bytes a
// token, as a parsed prompt is); other paths (audio, uploads) keep 512.
func TestUnparsedInferenceBodyIsWeighedByItsSize(t *testing.T) {
	prompt := strings.Repeat("lorem ipsum dolor sit amet ", 20000) // 540 KB
	for _, c := range []struct {
		name, path, body string
		cl, max          int64
		min              int64
	}{
		{"NaN field", "/v1/completions", `{"prompt":"` + prompt + `","temperature":NaN}`, -1, 4 << 20, int64(len(prompt)) / 4},
		{"float max_tokens", "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":100.0}`, -1, 4 << 20, int64(len(prompt)) / 4},
		{"over the bound, unknown length", "/v1/completions", `{"prompt":"` + prompt + `"}`, -1, 64 << 10, 64 << 10 / 4},
		{"over the bound, known length", "/generate", `{"text":"` + prompt + `"}`, int64(len(prompt) + 11), 64 << 10, int64(len(prompt)) / 4},
	} {
		r, _, _ := newRequest(t)
		r.URL.Path = c.path
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(c.body)), c.cl
		ri := requestInfoFor(r, c.max, true)
		if ri.Parsed {
			t.Fatalf("%s: parsed", c.name)
		}
		if got := ri.estimatedTokens(); got < c.min || got > maxEstimatedTokens {
			t.Errorf("%s: a %d-byte body weighed %d tokens, want at least %d", c.name, len(c.body), got, c.min)
		}
		if got, _ := io.ReadAll(r.Body); string(got) != c.body {
			t.Errorf("%s: the replica gets %d bytes, want %d", c.name, len(got), len(c.body))
		}
	}
	// Other paths, and small bodies, as before.
	for _, c := range []struct{ path, body string }{
		{"/v1/audio/transcriptions", strings.Repeat("\x00audio", 100000)},
		{"/v1/completions", `{"prompt":"hi","x":NaN}`},
	} {
		r, _, _ := newRequest(t)
		r.URL.Path = c.path
		r.Body = io.NopCloser(strings.NewReader(c.body))
		if got := requestInfoFor(r, 4<<20, true).estimatedTokens(); got != assumedRequestTokens {
			t.Errorf("%s: %d-byte body weighed %d tokens, want %d", c.path, len(c.body), got, assumedRequestTokens)
		}
	}
}
