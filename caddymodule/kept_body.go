package caddymodule

import (
	"bytes"
	"io"
	"net/http"
)

// keptBody is the client's request body as the custom_router handler
// passes it on. A policy that routes by the prompt reads the body in
// Select, on reverse_proxy's copy of the request, and the copy shares the
// client's body: without this, a handler that runs after reverse_proxy on
// the client's request (a handle_errors reverse_proxy to a fallback)
// found it read and sent an empty body (502). Once Sluice has read all of
// it through here (requestInfoFor), it reads from the start again. A body
// over the read bound streams to the replica as it comes and cannot be
// given twice; nor can one behind no Sluice handler (reverse_proxy with
// static upstreams), since a policy cannot reach the client's request.
type keptBody struct {
	io.ReadCloser
	n      int64 // bytes read through it
	again  bytes.Reader
	replay bool
}

// keepClientBody makes r's body (if any) a keptBody, in r's request state;
// the caller is the handler in front of reverse_proxy.
func keepClientBody(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	// The state is made here, before any policy says whether it reads
	// the body: room for the parsed body costs a request that never reads
	// it 320 B in the one allocation it makes anyway; without it,
	// cache_aware and load_aware would make a second.
	rs := handlerStateOf(r)
	if rs.body.ReadCloser != nil {
		return // kept already
	}
	rs.body.ReadCloser = r.Body
	r.Body = rs.body
}

func (b *keptBody) Read(p []byte) (int, error) {
	if b.replay {
		return b.again.Read(p)
	}
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

// readWhole makes b read whole again from the start, if whole is all that
// was read through it (a body read before it was kept is not its to give).
// A nil b (no Sluice handler keeps the body) does nothing.
func (b *keptBody) readWhole(whole []byte) {
	if b == nil || b.ReadCloser == nil || b.replay || b.n != int64(len(whole)) {
		return
	}
	b.again.Reset(whole)
	b.replay = true
}
