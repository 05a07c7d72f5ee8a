package caddymodule

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/lb"
)

// Caddy gives a selection policy no hook for "the proxied request ended",
// so Sluice ties each dispatched attempt to the request:
//
//   - Select runs again for the same request only when reverse_proxy
//     retries, i.e. the previous attempt failed: that attempt is released
//     as a Failure before the next pick.
//   - context.AfterFunc on the request context fires once the whole
//     handler chain has returned (or the client has gone): the last
//     attempt is released then, classified from what reverse_proxy left in
//     the Replacer.
//
// Both paths take the attempt under one mutex, and a lease's Release is
// itself idempotent, so every increment is released exactly once: on
// success, error, retry, client disconnect, panic (the context is still
// cancelled when net/http recovers) and reload (the state outlives it).

// releaser is what a policy hands out per attempt.
type releaser interface {
	Release(lb.Outcome) bool
}

// latencyMeasure says which latency feeds a policy's EWMA.
type latencyMeasure string

const (
	// measureAuto: time to first byte for streamed responses
	// (text/event-stream), time to last byte for the rest. A stream's
	// length is set by how many tokens the client asked for, not by how
	// loaded the replica is; its first byte (queue + prefill) is the load
	// signal. A plain response's last byte is the reference's measure.
	measureAuto      latencyMeasure = "auto"
	measureLastByte  latencyMeasure = "last_byte"
	measureFirstByte latencyMeasure = "first_byte"
)

// Replacer keys reverse_proxy sets; attempt start clears them so what is
// read at the end belongs to the last attempt.
const (
	keyStatus      = "http.reverse_proxy.status_code"
	keyFirstByte   = "http.reverse_proxy.upstream.latency"
	keyLastByte    = "http.reverse_proxy.upstream.duration"
	keyContentType = "http.reverse_proxy.header.Content-Type"
	keyError       = "http.error"
)

type attempt struct {
	mu      sync.Mutex
	repl    *caddy.Replacer
	measure latencyMeasure
	lease   releaser
	closed  bool // the request is over: no new attempt may start
	refused bool // Sluice already answered this request itself
}

// attemptFor returns the request's attempt record for the policy keyed by
// key, creating it (and its end-of-request hook) on first use.
func attemptFor(r *http.Request, key string, measure latencyMeasure) *attempt {
	ctx := r.Context()
	if a, ok := caddyhttp.GetVar(ctx, key).(*attempt); ok {
		return a
	}
	repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	a := &attempt{repl: repl, measure: measure}
	caddyhttp.SetVar(ctx, key, a)
	context.AfterFunc(ctx, a.finish)
	return a
}

// startAttempt is the preamble of every Sluice policy's Select: the
// request's attempt record, with the previous attempt (if any) released as
// a failure; nil when Sluice already answered this request or the client
// is gone, and Select should return nil.
func startAttempt(r *http.Request, key string, measure latencyMeasure) *attempt {
	a := attemptFor(r, key, measure)
	if a.wasRefused() {
		return nil
	}
	a.retry()
	if r.Context().Err() != nil {
		return nil
	}
	return a
}

// retry releases the previous attempt, if any, as a failure: reverse_proxy
// only calls Select again after an attempt failed.
func (a *attempt) retry() {
	a.mu.Lock()
	prev := a.lease
	a.lease = nil
	a.mu.Unlock()
	if prev != nil {
		prev.Release(lb.Outcome{Kind: lb.Failure})
	}
}

// begin records l as the current attempt. If the request already ended,
// l is released at once and begin returns false.
func (a *attempt) begin(l releaser) bool {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		l.Release(lb.Outcome{Kind: lb.Cancelled})
		return false
	}
	a.lease = l
	for _, k := range []string{keyStatus, keyFirstByte, keyLastByte, keyContentType, keyError} {
		a.repl.Delete(k)
	}
	a.mu.Unlock()
	return true
}

func (a *attempt) finish() {
	a.mu.Lock()
	a.closed = true
	l := a.lease
	a.lease = nil
	a.mu.Unlock()
	if l != nil {
		l.Release(a.outcome())
	}
}

// outcome classifies the last attempt from the Replacer:
//   - body fully copied (upstream.duration set): a Success below 500, else
//     a Failure;
//   - headers but no complete body: the stream was cut (client gone or
//     replica died mid-body); a Success by first byte for measure
//     first_byte/auto-stream, else Cancelled — it says nothing reliable;
//   - no response and a handler error: a transport failure;
//   - nothing at all: the client left before the replica answered.
func (a *attempt) outcome() lb.Outcome {
	status, hasStatus := a.repl.Get(keyStatus)
	code, _ := status.(int)
	if !hasStatus {
		if _, failed := a.repl.Get(keyError); failed {
			return lb.Outcome{Kind: lb.Failure}
		}
		return lb.Outcome{Kind: lb.Cancelled}
	}
	if code >= 500 {
		return lb.Outcome{Kind: lb.Failure, Status: code}
	}
	useFirst := a.measure == measureFirstByte
	if a.measure == measureAuto {
		ct, _ := a.repl.GetString(keyContentType)
		useFirst = strings.HasPrefix(ct, "text/event-stream")
	}
	if useFirst {
		if d, ok := durationVar(a.repl, keyFirstByte); ok {
			return lb.Outcome{Kind: lb.Success, Latency: d, Status: code}
		}
	}
	if d, ok := durationVar(a.repl, keyLastByte); ok {
		return lb.Outcome{Kind: lb.Success, Latency: d, Status: code}
	}
	return lb.Outcome{Kind: lb.Cancelled, Status: code}
}

func durationVar(repl *caddy.Replacer, key string) (time.Duration, bool) {
	v, ok := repl.Get(key)
	if !ok {
		return 0, false
	}
	d, ok := v.(time.Duration)
	return d, ok
}

// refuse writes rf once per request; a later Select for the same request
// (lb_try_duration retries) returns nil without writing again. It marks
// the request so custom_router, when it wraps reverse_proxy, can swallow
// the "no upstreams" error Caddy would otherwise log for every refusal.
func (a *attempt) refuse(r *http.Request, w http.ResponseWriter, rf refusal) {
	a.mu.Lock()
	already := a.refused
	a.refused = true
	a.mu.Unlock()
	if !already {
		caddyhttp.SetVar(r.Context(), refusedVar, rf.Type)
		rf.write(w)
	}
}

// refusedVar names the request variable holding the refusal type; it is
// also usable in log fields and matchers as {http.vars.sluice_refused}.
const refusedVar = "sluice_refused"

func (a *attempt) wasRefused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused
}
