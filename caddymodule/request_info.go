package caddymodule

import (
	"bytes"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/lb/reqtext"
)

// DefaultMaxBodyBytes bounds how much of a request body Sluice buffers to
// read the prompt: generous for long-context prompts, bounded for memory.
const DefaultMaxBodyBytes = 4 << 20

// requestInfoVar caches the parsed request for the rest of the request's
// life (retries, other Sluice modules).
const requestInfoVar = "sluice.request"

// requestInfo is what Sluice knows of an inference request's body.
type requestInfo struct {
	reqtext.Request
	// Parsed is false when the body was over the bound, not JSON, or not
	// an inference call: policies then route by load alone.
	Parsed bool
}

// requestInfoFor parses r's body once: it reads up to max bytes, extracts
// model and prompt text, and puts the bytes back in front of the unread
// rest, so the replica receives the body unchanged whatever happened.
// Works both in a handler (r is the client's request) and in a selection
// policy (r is reverse_proxy's clone, whose Body is what gets sent).
func requestInfoFor(r *http.Request, max int64) *requestInfo {
	if ri, ok := caddyhttp.GetVar(r.Context(), requestInfoVar).(*requestInfo); ok {
		return ri
	}
	ri := &requestInfo{}
	caddyhttp.SetVar(r.Context(), requestInfoVar, ri)
	if r.Body == nil || r.Body == http.NoBody || r.Method == http.MethodGet || r.Method == http.MethodHead {
		return ri
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	r.Body = &replayBody{Reader: io.MultiReader(bytes.NewReader(buf), r.Body), closer: r.Body}
	if err != nil || int64(len(buf)) > max {
		return ri // too big or broken: route by load; the body still goes through intact
	}
	if req, err := reqtext.Extract(r.URL.Path, buf); err == nil && req.Kind != reqtext.KindOther {
		ri.Request, ri.Parsed = req, true
	}
	return ri
}

// replayBody serves the buffered prefix then the rest; Close closes the
// original body (which, in reverse_proxy, is itself protected from being
// closed by a failed dial).
type replayBody struct {
	io.Reader
	closer io.Closer
}

func (b *replayBody) Close() error { return b.closer.Close() }

// Sizes assumed for active_tokens when the body does not tell.
const (
	// assumedOutputTokens stands for a request that sets no output limit
	// (engines then stop at the context length, but most answers are
	// short).
	assumedOutputTokens = 256
	// assumedRequestTokens stands for a body Sluice could not parse.
	assumedRequestTokens = 512
)

// estimatedTokens is the request's size as active_tokens weighs it: its
// prompt plus the output it may generate (max_tokens), both of which hold
// KV cache and take engine steps for as long as it runs.
func (ri *requestInfo) estimatedTokens() int64 {
	if !ri.Parsed {
		return assumedRequestTokens
	}
	out := ri.MaxTokens
	if out <= 0 {
		out = assumedOutputTokens
	}
	return int64(ri.PromptTokens) + int64(out)
}
