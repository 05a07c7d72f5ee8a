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

	small := requestInfoFor(r, 100) // e.g. flow_control with max_body_bytes 100
	if small.Parsed {
		t.Fatal("a 2 KB body parsed within a 100-byte bound")
	}
	large := requestInfoFor(r, 1<<20) // then a policy with the default bound
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
	if got := requestInfoFor(r, 1<<20).estimatedTokens(); got != assumedRequestTokens {
		t.Fatalf("unparsed body estimated at %d tokens, want %d", got, assumedRequestTokens)
	}
}

// A client's huge max_tokens must not make its request weigh more than
// any model could serve (it closed the token gate for everyone).
func TestTokenEstimateIsCapped(t *testing.T) {
	r, _, _ := newRequest(t)
	r.URL.Path = "/v1/completions"
	r.Body = io.NopCloser(strings.NewReader(`{"prompt":"hi","max_tokens":9223372036854775807}`))
	ri := requestInfoFor(r, 1<<20)
	if !ri.Parsed {
		t.Fatal("not parsed")
	}
	if got := ri.estimatedTokens(); got != maxEstimatedTokens {
		t.Fatalf("estimate %d, want the cap %d", got, maxEstimatedTokens)
	}
}
