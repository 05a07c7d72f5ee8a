package caddymodule

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// vLLM, SGLang and TGI send a stream's status and headers as soon as the
// request is accepted, before it queues or prefills: the transport's first
// response byte (the attempt trace's) then says nothing of the engine's
// load, and a policy learning from it (queued_least_latency's stream
// EWMA, its prefill queue, slow start's doubling) saw an idle engine in
// every one. The first token is the first byte of the body. A selection
// policy cannot see the body; a Sluice handler in front of reverse_proxy
// (custom_router, flow_control) can: it passes reverse_proxy a writer
// that notes when the response body's first bytes go to the client
// (reverse_proxy writes each chunk as it reads it), and the attempt then
// learns from that moment (attempt.bodyBegan). Without such a handler,
// the headers' first byte is all there is.

// bodyWatch is the writer: the client's, noting the first body write. It
// lives in the request's state (handlerParts: no allocation of its own).
type bodyWatch struct {
	caddyhttp.ResponseWriterWrapper // Unwrap, ReadFrom, Push: Flush and Hijack reach the client's
	rs                              *requestState
	began                           bool // only the request's goroutine writes the body
}

// watchBody returns the writer to hand reverse_proxy for r: w, watched
// (a handler further out already watches it: w is its watch).
func watchBody(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	rs := handlerStateOf(r)
	if rs.out.rs != nil {
		return w
	}
	rs.out.ResponseWriter, rs.out.rs = w, rs
	return rs.out
}

// watched reports whether a Sluice handler watches the request's body.
func (rs *requestState) watched() bool { return rs != nil && rs.out != nil && rs.out.rs != nil }

func (b *bodyWatch) Write(p []byte) (int, error) {
	if len(p) > 0 && !b.began {
		b.began = true
		now := time.Now()
		for _, ka := range b.rs.attempts {
			ka.a.bodyBegan(now)
		}
	}
	return b.ResponseWriter.Write(p)
}
