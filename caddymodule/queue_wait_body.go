package caddymodule

import (
	"context"
	"net/http"

	"github.com/sluice-router/sluice/lb"
)

// A request that waits in a policy's queue reads its client's body first
// (up to DefaultMaxBodyBytes, put back in front of the rest as every read
// of Sluice's is): net/http notices that an HTTP/1 client hung up only
// once the handler has read the request body, and until then the queued
// request's context does not end when its client leaves. A long prompt or
// an upload over the 16 KiB every policy reads ahead kept its place until
// its queue_timeout and then went to a replica for nobody. A body over the
// bound stays unread (its client is noticed at dispatch), and so does one
// the config does not let the policy read (see body_read_ahead.go).

// Waiting implements lb.Waiter. A pick that leaves the queue without a
// replica (left) cuts the read short, as flow_control's does
// (readBodyUntil): its refusal must not wait for a slow upload.
func (a *attempt) Waiting(left context.Context) {
	r := a.waitReq
	if r == nil || !a.waitReads || r.Body == nil || r.Body == http.NoBody || a.rs == nil {
		return
	}
	if r.ContentLength > DefaultMaxBodyBytes {
		// Declared over the bound: reading the bound of it would not let
		// net/http notice its client leave, only hold it in memory for
		// each such request queued (and consume a kept body a
		// handle_errors fallback would send without it).
		return
	}
	a.rs.readBodyUntil(left, a.waitW, r, DefaultMaxBodyBytes)
}

var _ lb.Waiter = (*attempt)(nil)
