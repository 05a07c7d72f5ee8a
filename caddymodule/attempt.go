package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/lb"
)

// Caddy gives a selection policy no hook for "the proxied attempt ended",
// so Sluice ties each dispatched attempt to the request:
//
//   - Select runs again for the same request only when reverse_proxy
//     retries, i.e. the previous attempt failed: that attempt is released
//     as a Failure before the next pick.
//   - The transport reports the response body read to its end (HTTP/1,
//     via the trace below): the replica is done, and the attempt is
//     released at once, before the client can send its next request.
//   - context.AfterFunc on the request context fires once the whole
//     handler chain has returned (or the client has gone): the last
//     attempt, if still held, is released then.
//
// What the attempt's outcome is comes from the attempt itself: Select
// attaches an HTTP client trace to the request reverse_proxy sends, so
// the transport reports this attempt's dial errors, its first response
// byte and the end of its response body. Request-wide placeholders are
// only read where they can be checked to belong to this attempt (a second
// reverse_proxy in handle_errors or handle_response overwrites them).
//
// Every release path takes the attempt under one mutex, and a lease's
// Release is itself idempotent, so every increment is released exactly
// once: on success, error, retry, client disconnect, panic (the context
// is still cancelled when net/http recovers) and reload (the state
// outlives it).

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

// Replacer keys reverse_proxy sets per attempt; attempt start clears them.
const (
	keyStatus      = "http.reverse_proxy.status_code"
	keyHostport    = "http.reverse_proxy.upstream.hostport"
	keyLastByte    = "http.reverse_proxy.upstream.duration"
	keyContentType = "http.reverse_proxy.header.Content-Type"
	keyError       = "http.error"
)

// attemptKeys are the placeholders an attempt's outcome reads.
var attemptKeys = [...]string{keyStatus, keyHostport, keyLastByte, keyContentType, keyError}

// attempt is one request's record for one policy, across its retries.
type attempt struct {
	mu      sync.Mutex
	repl    *caddy.Replacer
	rs      *requestState   // the request's, with its other policies' records
	base    context.Context // the request's context before any trace
	measure latencyMeasure
	lease   lb.Lease
	trace   *attemptTrace
	closed  bool // the request is over: no new attempt may start
	refused bool // Sluice already answered this request itself
	// bodyWhole: the next attempt's request body is Sluice's in-memory
	// copy (requestInfo.bodyFor), whose reads cannot fail; begin leaves it
	// unwrapped, so net/http still sees it is in memory. Set by Select.
	bodyWhole bool

	// req is what the policy knows of the request, kept across retries.
	req *lb.Request
	// waitReq is the request of the attempt being picked, whose body is
	// read if the pick waits in a queue (Waiting, queue_wait_body.go);
	// waitReads: the config lets the policy read it.
	waitReq   *http.Request
	waitReads bool
	// waitW is the client's writer of the attempt being picked (nil
	// without one: a policy as another's fallback), whose read deadline
	// cuts a waiting pick's body read when it leaves the queue unserved
	// (readBodyUntil).
	waitW http.ResponseWriter
	// retrying: this Select is reverse_proxy's retry of the previous
	// attempt (set by startAttempt, read by retry).
	retrying bool
	// failed lists the replicas whose attempts at this request failed,
	// or whose answers reverse_proxy retried (retry_match): a retry
	// avoids them.
	failed []string
	// kept: the placeholders this attempt's outcome reads, as they were
	// when another policy's attempt on the same request began and
	// cleared them (a second reverse_proxy in handle_errors or
	// handle_response through another pool); nil while the Replacer's
	// are this attempt's.
	kept map[string]any

	// Storage for req and the first attempt's trace, in the record's own
	// allocation; only the request's goroutine (Select) takes them.
	reqStore   lb.Request
	trace0     attemptTrace
	trace0Used bool
}

// newTrace is a fresh trace for an attempt of a's request: the record's
// own the first time, a new one after (an earlier attempt's transport
// may still report on its own).
func (a *attempt) newTrace() *attemptTrace {
	if a.trace0Used {
		return &attemptTrace{}
	}
	a.trace0Used = true
	return &a.trace0
}

// attemptFor returns the request's attempt record for the policy keyed by
// key, creating it (and its end-of-request hook) on first use.
func attemptFor(r *http.Request, key string, measure latencyMeasure) *attempt {
	rs, repl := requestStateFor(r)
	return rs.attemptFor(r, repl, key, measure)
}

func (rs *requestState) attemptFor(r *http.Request, repl *caddy.Replacer, key string, measure latencyMeasure) *attempt {
	if a := rs.attempt(key); a != nil {
		return a
	}
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	a := rs.newAttempt()
	a.repl, a.base, a.measure, a.rs = repl, r.Context(), measure, rs
	rs.addAttempt(key, a)
	return a
}

// startAttempt is the preamble of Select: the request's attempt record,
// with the previous attempt (if any) released as a failure; nil when
// Sluice already answered this request or the client is gone, and Select
// should return nil.
func startAttempt(r *http.Request, key string, measure latencyMeasure) *attempt {
	rs, repl := requestStateFor(r)
	return rs.startAttempt(r, repl, key, measure)
}

func (rs *requestState) startAttempt(r *http.Request, repl *caddy.Replacer, key string, measure latencyMeasure) *attempt {
	a := rs.attemptFor(r, repl, key, measure)
	if a.wasRefused() {
		return nil
	}
	// reverse_proxy's retry loop gives Select the same copy of the
	// request again; a second reverse_proxy makes its own.
	a.retrying = a.waitReq != nil && r == a.waitReq
	a.retry()
	if a.base.Err() != nil {
		return nil
	}
	return a
}

// retry releases the previous attempt, if any, as a failure: reverse_proxy
// only calls Select again after an attempt failed.
//
// Unless the replica answered: then the new Select is either a second
// reverse_proxy on the same pool (in handle_response), or reverse_proxy's
// retry of an answer its retry_match matched ({rp.status_code}, e.g. a
// 429); the answered attempt is released for what it was. A retry
// (a.retrying) avoids the replica whatever it answered: the matched
// answer is the reason to ask another.
func (a *attempt) retry() {
	a.mu.Lock()
	prev, pt := a.lease, a.trace
	a.lease, a.trace = nil, nil
	retried := a.retrying
	o := lb.Outcome{Kind: lb.Failure}
	if prev != nil {
		if first, _, _, _ := pt.facts(); first > 0 {
			var kind answerKind
			o, _, kind = a.classify(prev.Replica(), pt, a.kept)
			a.learnFirstByte(pt, o, kind)
		}
		if o.Kind == lb.Failure || retried {
			a.failed = append(a.failed, prev.Replica())
		}
	}
	a.mu.Unlock()
	pt.close()
	if prev != nil {
		prev.Release(o)
	}
}

// begin records l as the current attempt and attaches the attempt's trace
// to r, the request reverse_proxy is about to send. If the request already
// ended, l is released at once and begin returns false.
//
// fb says how the attempt's time to first byte is bounded and learned.
func (a *attempt) begin(l lb.Lease, r *http.Request, fb firstByteRule) bool {
	// One allocation (none for the first attempt: the record's) for
	// everything the attempt adds to the request: its trace, its context
	// and its body wrapper.
	whole := a.bodyWhole
	a.bodyWhole = false
	t := a.newTrace()
	t.base, t.firstByteRule, t.att = a.base, fb, a
	_, t.firstByter = l.(lb.FirstByter)
	t.bodyWatched = a.rs.watched()
	// The attempt's clock starts now, not at the transport's GetConn: a
	// hook fewer per attempt, for the microseconds reverse_proxy takes to
	// prepare the request.
	t.start = time.Now()
	// The attempt's end-of-request hook (requestEnded, which runs finish)
	// is armed with its context: while a lease is out, a request that
	// ends releases it. If the request ends before the lease is recorded
	// below, finish either runs first (closed: the lease goes back here)
	// or waits for a.mu and finds the lease.
	t.ctx.init(a.base, t.requestEnded)
	// Another policy's attempt on this request that is still out (the
	// request went on to a second reverse_proxy) keeps the placeholders
	// its outcome reads before this one clears them. Never on the usual
	// request, with one policy.
	if a.rs != nil && len(a.rs.attempts) > 1 {
		for _, ka := range a.rs.attempts {
			if ka.a != a {
				ka.a.keepPlaceholders()
			}
		}
	}
	a.mu.Lock()
	if a.closed || a.base.Err() != nil {
		a.closed = true
		a.mu.Unlock()
		t.ctx.stop()
		l.Release(lb.Outcome{Kind: lb.Cancelled})
		return false
	}
	a.lease, a.trace, a.kept = l, t, nil
	// Watched before a.mu is let go: finish takes the trace under a.mu,
	// so it always finds it to unwatch (watched after, it outlived a
	// request that ended in between, for up to the whole limit).
	if t.limit > 0 {
		t.deadline = t.start.Add(t.limit)
		firstByteWatched.watch(t)
	}
	for _, k := range attemptKeys {
		a.repl.Delete(k)
	}
	a.mu.Unlock()
	// Built on the request's own context, not on the previous attempt's
	// traced one: an old trace must not report on a new attempt.
	t.setHooks()
	*r = *r.WithContext(httptrace.WithClientTrace(&t.ctx, &t.hooks))
	if r.Body != nil && r.Body != http.NoBody && !whole {
		t.body = clientBody{ReadCloser: r.Body, t: t}
		r.Body = &t.body
	}
	return true
}

// bodyRead releases the attempt traced by t once the replica's response
// body was read to its end: the replica's work is done, and the client
// may send its next request before the handler chain returns (a lease
// held until then made a sequential client of a max_inflight 1 pool find
// the slot busy). finish still closes the trace.
func (a *attempt) bodyRead(t *attemptTrace) {
	a.mu.Lock()
	l := a.lease
	if a.trace != t || l == nil {
		a.mu.Unlock()
		return
	}
	o, statusKnown, kind := a.classify(l.Replica(), t, a.kept)
	if !statusKnown {
		// A response with no body (HEAD, 204, 304, Content-Length: 0)
		// is read to its end before the transport hands it to
		// reverse_proxy, which has not set its status yet: released now,
		// a bodyless 5xx was a Success. A retry or the request's end
		// releases it, status known.
		a.mu.Unlock()
		return
	}
	a.lease = nil
	a.learnFirstByte(t, o, kind)
	if o.Kind == lb.Failure { // a 5xx: a retry must avoid it too
		a.failed = append(a.failed, l.Replica())
	}
	// Nothing is left for the request's end to release: the attempt left
	// the first-byte watch at its first byte, and the transport is done
	// with its context. Disarming the hook saves the goroutine
	// context.AfterFunc starts at the end of every request. A later
	// attempt arms its own.
	t.ctx.detach()
	a.mu.Unlock()
	l.Release(o)
}

// bodyBegan notes that the current attempt's response body began to
// reach the client at now (bodyWatch): for a stream, its first token. A
// lease that learns from first bytes learns from this one.
func (a *attempt) bodyBegan(now time.Time) {
	a.mu.Lock()
	t := a.trace
	a.mu.Unlock()
	if t == nil || !t.bodyWatched {
		return
	}
	t.mu.Lock()
	set := t.firstByte > 0 && t.bodyByte == 0
	if set {
		t.bodyByte = max(now.Sub(t.start), t.firstByte)
	}
	d := t.bodyByte
	t.mu.Unlock()
	if set && t.firstByter {
		a.firstByte(t, d)
	}
}

// firstByte tells the lease of the attempt traced by t, if it learns
// from it (lb.FirstByter), that the replica's response began.
func (a *attempt) firstByte(t *attemptTrace, d time.Duration) {
	a.mu.Lock()
	l := a.lease
	if a.trace != t {
		l = nil
	}
	a.mu.Unlock()
	if fb, ok := l.(lb.FirstByter); ok {
		fb.FirstByte(d)
	}
}

func (a *attempt) finish() {
	a.mu.Lock()
	a.closed = true
	l, t, kept := a.lease, a.trace, a.kept
	a.lease, a.trace = nil, nil
	a.mu.Unlock()
	t.close()
	if l != nil {
		o, _, kind := a.classify(l.Replica(), t, kept)
		a.learnFirstByte(t, o, kind)
		l.Release(o)
	}
}

// answerKind is what an attempt's answer was, by its Content-Type
// (classify reads it while the placeholders name the attempt's replica).
type answerKind uint8

const (
	answerUnread   answerKind = iota // no Content-Type of this attempt's
	answerStreamed                   // text/event-stream
	answerWhole
)

// learnFirstByte teaches the replica of the attempt traced by t (which
// had outcome o and answer kind) its answer's first byte, once per
// attempt (as it is released), by the answer's kind, else what the
// request said. A refusal or an error (4xx, 5xx) teaches nothing: a
// replica's fast 429s or 503s made its usual time short, and its next
// healthy answers were cut at the floor.
func (a *attempt) learnFirstByte(t *attemptTrace, o lb.Outcome, kind answerKind) {
	if t == nil || t.usual == nil {
		return
	}
	first, _, _, _ := t.facts()
	t.usual.released(t.start, first, o)
	if first <= 0 || o.Status >= 400 {
		return
	}
	streamed, known := t.streamed, !t.kindUnknown
	if kind != answerUnread {
		streamed, known = kind == answerStreamed, true
	}
	if known {
		t.usual.learn(first, streamed)
	}
}

// keepPlaceholders copies, for the attempt still out, the placeholders
// its outcome reads, which another policy's attempt is about to clear.
func (a *attempt) keepPlaceholders() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lease == nil || a.kept != nil {
		return // nothing out, or kept before an earlier attempt cleared them
	}
	kept := make(map[string]any, len(attemptKeys))
	for _, k := range attemptKeys {
		if v, ok := a.repl.Get(k); ok {
			kept[k] = v
		}
	}
	a.kept = kept
}

// placeholder is key's value for an attempt whose kept placeholders
// are kept (nil: the Replacer's).
func (a *attempt) placeholder(kept map[string]any, key string) (any, bool) {
	if kept != nil {
		v, ok := kept[key]
		return v, ok
	}
	return a.repl.Get(key)
}

// classify is the last attempt's outcome, reading the placeholders kept
// (nil: the Replacer's):
//   - no response byte: a Failure if the attempt was abandoned at its
//     first-byte limit, or the handler chain ended in an error (our
//     reverse_proxy gave up on it: Caddy's server sets {http.error}
//     before the request ends); otherwise the client left first;
//   - a response: a Failure if its status (read only while the
//     placeholders still name this attempt's replica) is 5xx; else a
//     Success timed by the attempt's own trace — first byte for
//     first_byte (and streams under auto), last byte otherwise; a body
//     that never completed says nothing (Cancelled).
//
// statusKnown is false when the replica answered but reverse_proxy has
// not yet set the status placeholder for it; kind is the answer's, by its
// Content-Type (for the replica's usual first byte, learnFirstByte).
func (a *attempt) classify(dial string, t *attemptTrace, kept map[string]any) (o lb.Outcome, statusKnown bool, kind answerKind) {
	first, last, transportErr, clientErr := t.facts()
	if first == 0 {
		if clientErr {
			return lb.Outcome{Kind: lb.Cancelled}, true, answerUnread // the client's upload broke, not the replica
		}
		if _, failed := a.placeholder(kept, keyError); failed || transportErr {
			return lb.Outcome{Kind: lb.Failure}, true, answerUnread
		}
		return lb.Outcome{Kind: lb.Cancelled}, true, answerUnread
	}
	hp, _ := a.placeholder(kept, keyHostport)
	ours := caddy.ToString(hp) == dial
	code, statusKnown := 0, !ours
	if ours {
		var v any
		v, statusKnown = a.placeholder(kept, keyStatus)
		code, _ = v.(int)
	}
	if code >= 500 {
		return lb.Outcome{Kind: lb.Failure, Status: code}, true, answerUnread
	}
	if ours {
		if ct, ok := a.placeholder(kept, keyContentType); ok {
			kind = answerWhole
			if strings.HasPrefix(caddy.ToString(ct), "text/event-stream") {
				kind = answerStreamed
			}
		}
	}
	if a.measure == measureFirstByte || (a.measure == measureAuto && kind == answerStreamed) {
		if body := t.bodyBegan(); body > 0 {
			first = body // the first token, where the headers came at once (bodyWatch)
		}
		return lb.Outcome{Kind: lb.Success, Latency: first, Status: code, Streamed: true, Total: last}, statusKnown, kind
	}
	if last > 0 {
		return lb.Outcome{Kind: lb.Success, Latency: last, Status: code, Total: last}, statusKnown, kind
	}
	if ours { // HTTP/2 upstreams report no body end to the trace
		if v, ok := a.placeholder(kept, keyLastByte); ok {
			if d, ok := v.(time.Duration); ok {
				return lb.Outcome{Kind: lb.Success, Latency: d, Status: code, Total: d}, statusKnown, kind
			}
		}
	}
	return lb.Outcome{Kind: lb.Cancelled, Status: code}, statusKnown, kind
}

// attemptTrace is what the transport reports about one attempt.
type attemptTrace struct {
	base          context.Context // the request's
	ctx           attemptContext  // the attempt's
	hooks         httptrace.ClientTrace
	body          clientBody // wraps the request body, when there is one
	firstByteRule            // the attempt's first-byte limit, and the replica's record it learns
	// firstByter: the attempt's lease learns from its first byte
	// (lb.FirstByter); the others skip the record's lock for it.
	firstByter bool
	// bodyWatched: a Sluice handler watches the response body (bodyWatch):
	// the lease learns from the body's first byte, not the headers'.
	bodyWatched bool
	// att is released early (attempt.bodyRead) once the response body was
	// read to its end; nil in tests of the trace alone.
	att *attempt

	start time.Time // set before the trace is shared, then read-only

	// The first-byte watch's fields (firstByteWatch.mu): the deadline and
	// the links of the list of attempts waiting for their first byte.
	deadline             time.Time
	watchPrev, watchNext *attemptTrace
	watched              bool

	// The client's upload (clientBody): the transport is waiting for the
	// client's bytes now; when it last had them, in ns since start (0:
	// not yet).
	uploading atomic.Bool
	uploaded  atomic.Int64

	mu        sync.Mutex
	firstByte time.Duration
	bodyByte  time.Duration // the body's first byte to the client (bodyWatched only)
	lastByte  time.Duration
	// transportErr: the attempt was abandoned at its first-byte limit
	// (expire); a first byte after it is not its answer.
	transportErr bool
	clientErr    bool // reading the client's body failed (e.g. a truncated upload)
}

// requestEnded is the attempt's end-of-request hook: the attempt's
// context ends as the request's did, and the attempt record releases what
// it still holds.
func (t *attemptTrace) requestEnded() {
	t.ctx.parentEnded()
	if t.att != nil {
		t.att.finish()
	}
}

// expire abandons an attempt still waiting for its first byte.
func (t *attemptTrace) expire() {
	t.mu.Lock()
	hung := t.firstByte == 0
	if hung {
		t.transportErr = true // the replica's failure
	}
	t.mu.Unlock()
	if hung {
		t.ctx.end(errFirstByteTimeout)
	}
}

// close ends what the attempt holds: its place in the first-byte watch
// and its context's link to the request's.
func (t *attemptTrace) close() {
	if t == nil {
		return
	}
	firstByteWatched.unwatch(t)
	t.ctx.stop()
}

func (t *attemptTrace) setHooks() {
	t.hooks = httptrace.ClientTrace{
		// No hook for the transport's errors (a failed dial, TLS
		// handshake or write): one the transport gives up on fails the
		// round trip, and reverse_proxy's retry (retry) or {http.error}
		// (classify) makes the attempt a Failure. One it recovers from
		// (a write to a keep-alive connection the replica dropped, sent
		// again on a new one; one address of a name refused, the next
		// answered) is nobody's failure. Heard here, such an error
		// voided the answer that followed, and the connect hook alone
		// cost three allocations per attempt (httptrace's net trace).
		GotFirstResponseByte: func() {
			t.mu.Lock()
			first := t.firstByte == 0 && !t.transportErr
			now := time.Now()
			if first {
				t.firstByte = max(now.Sub(t.start), time.Nanosecond)
			}
			d := t.firstByte
			t.mu.Unlock()
			if first {
				firstByteWatched.unwatch(t)
			}
			if first && t.usual != nil {
				// The replica is alive (unless it answers errors lately);
				// its usual time learns this first byte once the
				// answer's kind is known (learnFirstByte).
				if !t.usual.erring.Load() {
					t.usual.answered(now)
				}
			}
			if first && t.att != nil && t.firstByter && !t.bodyWatched {
				t.att.firstByte(t, d)
			}
		},
		// Called when the response body was read to its end and the
		// connection went back to the pool (HTTP/1): the last byte.
		PutIdleConn: func(err error) {
			t.mu.Lock()
			last := err == nil && t.firstByte > 0 && t.lastByte == 0
			if last {
				t.lastByte = time.Since(t.start)
			}
			t.mu.Unlock()
			if last && t.att != nil {
				t.att.bodyRead(t)
			}
		},
	}
}

// bodyBegan is when the attempt's response body began to reach the
// client, 0 if unknown (see bodyWatch).
func (t *attemptTrace) bodyBegan() time.Duration {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bodyByte
}

func (t *attemptTrace) facts() (first, last time.Duration, transportErr, clientErr bool) {
	if t == nil {
		return 0, 0, false, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.firstByte, t.lastByte, t.transportErr, t.clientErr
}

// clientBody notes when reading the client's request body fails: the
// transport then fails the attempt, and that is the client's doing. It
// also notes when the transport waits for the client's bytes: that time
// is the client's, not the replica's first-byte time (clientUntil).
type clientBody struct {
	io.ReadCloser
	t *attemptTrace
}

func (b *clientBody) Read(p []byte) (int, error) {
	t := b.t
	t.uploading.Store(true)
	n, err := b.ReadCloser.Read(p)
	t.uploaded.Store(max(int64(time.Since(t.start)), 1))
	t.uploading.Store(false)
	if err != nil && err != io.EOF {
		t.mu.Lock()
		t.clientErr = true
		t.mu.Unlock()
	}
	return n, err
}

// refuse writes rf once per request; a later Select for the same request
// (lb_try_duration retries) returns nil without writing again. It marks
// the request so custom_router, when it wraps reverse_proxy, can swallow
// the "no upstreams" error Caddy would otherwise log for every refusal.
// Without a ResponseWriter (a Sluice policy as another policy's fallback)
// only the mark is left: reverse_proxy answers 503 itself.
func (a *attempt) refuse(r *http.Request, w http.ResponseWriter, rf refusal) {
	a.mu.Lock()
	already := a.refused
	a.refused = true
	a.mu.Unlock()
	if !already && w != nil {
		caddyhttp.SetVar(r.Context(), refusedVar, rf.Type)
		rf.answer(w, r)
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
