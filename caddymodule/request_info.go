package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sluice-router/sluice/lb/reqtext"
)

// DefaultMaxBodyBytes bounds how much of a request body Sluice buffers to
// read the prompt: generous for long-context prompts, bounded for memory.
const DefaultMaxBodyBytes = 4 << 20

// requestInfo is what Sluice knows of an inference request's body.
type requestInfo struct {
	reqtext.Request
	// Parsed is false when the body was over the bound, not JSON, or not
	// an inference call: policies then route by load alone.
	Parsed bool

	buf      []byte    // the body's bytes read so far
	rest     io.Reader // the original body, past buf
	closer   io.Closer // the original body
	limit    int64     // the largest bound buf was read with
	complete bool      // buf is the whole body
	// parseTried: Parsed says what the whole body is (read within a
	// caller's bound once).
	parseTried bool
	// textless: the parse weighed the prompt without rendering its text
	// (reqtext.ExtractCounts); a caller that reads the text parses again.
	textless bool
	// inference: the path is an inference call's (chat, completions,
	// generate), whether its body parsed or not; declared is the body's
	// Content-Length (-1: not given). Together they weigh a body that
	// did not parse (estimatedTokens).
	inference bool
	declared  int64

	// The first replay and the first attempt's copy, in the same
	// allocation (later ones, rare, get their own).
	replay0     replayBody
	replay0Used bool
	copy0       bytes.Reader
	copy0Used   bool
}

// requestInfoFor parses r's body: it reads up to max bytes, extracts
// model and prompt text, and puts the bytes back in front of the unread
// rest, so the replica receives the body unchanged whatever happened.
// Works both in a handler (r is the client's request) and in a selection
// policy (r is reverse_proxy's clone, whose Body is what gets sent). The
// result is cached for the request; a later caller with a larger max reads
// further, so no module's bound decides for another.
//
// withText: the caller reads the prompt's text (Text, to route on it);
// without, the parse only weighs it (model, kind, token counts, messages),
// which spares a copy of the prompt.
func requestInfoFor(r *http.Request, max int64, withText bool) *requestInfo {
	rs, _ := requestStateOf(r, true)
	return rs.requestInfoFor(r, max, withText)
}

func (rs *requestState) requestInfoFor(r *http.Request, max int64, withText bool) *requestInfo {
	ri := rs.readBody(r, max)
	// Parsed once, when the body is whole within this caller's bound (a
	// body over it, or broken, is routed by load; it still goes through
	// intact); again, with its text, for a caller that reads the text
	// after one that did not (flow_control's token mode, then
	// cache_aware). Both parses fail alike, so a failed one is not redone.
	if ri.complete && ri.buf != nil && int64(len(ri.buf)) <= max && (!ri.parseTried || withText && ri.textless) {
		ri.parseTried = true
		extract := reqtext.Extract
		if !withText {
			extract = reqtext.ExtractCounts
		}
		if req, err := extract(r.URL.Path, ri.buf); err == nil && req.Kind != reqtext.KindOther {
			ri.Request, ri.Parsed, ri.textless = req, true, !withText
		}
	}
	return ri
}

// readBody reads up to max bytes of r's body into the request's state
// (once per bound: a larger one reads further) and puts them back in
// front of the unread rest, without parsing them.
func (rs *requestState) readBody(r *http.Request, max int64) *requestInfo {
	ri := rs.info
	if ri == nil {
		ri = rs.info0
		if ri == nil {
			ri = &requestInfo{}
		}
		rs.info = ri
		ri.inference = reqtext.KindOf(r.URL.Path) != reqtext.KindOther
		ri.declared = r.ContentLength
		if r.Body == nil || r.Body == http.NoBody || r.Method == http.MethodGet || r.Method == http.MethodHead {
			ri.complete = true
			return ri
		}
		ri.rest, ri.closer = r.Body, r.Body
	}
	if ri.complete || max <= ri.limit {
		return ri
	}
	want := max + 1 - int64(len(ri.buf))
	had := len(ri.buf)
	var err error
	ri.buf, err = readAtMost(ri.buf, ri.rest, want, r.ContentLength)
	ri.limit = max
	ri.complete = err == nil && int64(len(ri.buf)-had) < want
	rb := &ri.replay0
	if ri.replay0Used {
		rb = &replayBody{}
	}
	ri.replay0Used = true
	rb.ri = ri
	r.Body = rb
	if ri.complete {
		rs.body.readWhole(ri.buf) // the client's request keeps its body
	}
	return ri
}

// readBodyUntil is readBody for a request waiting in a queue: once left is
// done (the request left the queue undispatched and will be refused), a
// read still blocked on its client is cut short and what it read dropped,
// so the refusal goes out at once, not when a slow or stalled upload ends,
// and bytes no longer counted against max_bytes are not held.
//
// It is cut by a read deadline in the past on the client's connection
// (HTTP/1) or stream (HTTP/2, HTTP/3), which ends a blocked read of the
// body. left's callback runs on another goroutine (a TTL timer's, another
// request's), so the mutex lets it set the deadline only while this
// goroutine is inside the read: never once the read has returned (left is
// never done for a dispatched request, whose read completes), nor once the
// handler has returned and the connection may serve the next request.
//
// The deadline stays: before answering HTTP/1, net/http reads what is
// left of a small unread body (to reuse the connection), which would wait
// for the stalled client again; past the deadline it fails at once and the
// connection closes after the answer. Where the writer cannot set one (or
// there is none: a policy as another's fallback), the read ends with its
// upload, as it did before.
func (rs *requestState) readBodyUntil(left context.Context, w http.ResponseWriter, r *http.Request, max int64) {
	rc := http.NewResponseController(w)
	var mu sync.Mutex
	reading := true
	stop := context.AfterFunc(left, func() {
		mu.Lock()
		defer mu.Unlock()
		if reading {
			_ = rc.SetReadDeadline(longAgo)
		}
	})
	ri := rs.readBody(r, max)
	mu.Lock()
	reading = false
	mu.Unlock()
	stop()
	if left.Err() != nil && !ri.complete {
		// Refused: nothing will send this body, and its rest is past
		// the deadline. A body read whole before the cut stays intact.
		ri.buf, ri.rest = nil, cutBody{}
	}
}

// longAgo is a read deadline already past, whatever the clock says
// (HTTP/2 takes a deadline not yet past as a timer to start).
var longAgo = time.Unix(1, 0)

// cutBody is the rest of a body whose read was cut short (readBodyUntil).
type cutBody struct{}

func (cutBody) Read([]byte) (int, error) { return 0, errBodyCut }

var errBodyCut = errors.New("request body dropped: the request left the queue without being dispatched")

// smallBodyBytes bounds the bodies every policy reads whole before it
// picks, even one that routes without the prompt (body_read_ahead.go).
// Larger bodies stream as they come.
const smallBodyBytes = 16 << 10

// hasSmallBody: r states a body of at most smallBodyBytes.
func hasSmallBody(r *http.Request) bool {
	return r.ContentLength > 0 && r.ContentLength <= smallBodyBytes &&
		r.Body != nil && r.Body != http.NoBody
}

// bodyFor gives one attempt its own copy of a body read whole, so a retry
// after a failed attempt (whose transport closed the body it was given)
// sends the same bytes again, and reports whether it did. A body not read
// whole stays as it is.
//
// The copy is an io.NopCloser of a *bytes.Reader, which net/http knows
// is in memory: it writes the headers and the body together. Behind any
// other type it flushes the headers on their own first, to a replica
// that then reads twice (a write and a packet more per request than the
// body needs).
func (ri *requestInfo) bodyFor(r *http.Request) bool {
	if !ri.complete || ri.buf == nil {
		return false
	}
	b := &ri.copy0
	if ri.copy0Used {
		b = &bytes.Reader{}
	}
	ri.copy0Used = true
	b.Reset(ri.buf)
	r.Body = io.NopCloser(b)
	return true
}

// readAtMost appends up to n bytes of src to dst (io.ReadAll of a
// LimitReader without its doubling from 512 bytes): sized by hint (the
// Content-Length, -1 if unknown) plus one byte, so a body of known length
// is read into one allocation and its EOF seen without growing it. The
// size taken on trust is capped: a client announcing megabytes it never
// sends must not make Sluice hold them.
func readAtMost(dst []byte, src io.Reader, n, hint int64) ([]byte, error) {
	const trustedHint = 64 << 10
	if hint >= 0 {
		// Capped before the +1: net/http accepts a Content-Length of
		// 2⁶³-1, whose +1 wraps negative and made slices.Grow panic.
		dst = slices.Grow(dst, int(min(min(hint, trustedHint)+1, n, trustedHint)))
	}
	lr := io.LimitedReader{R: src, N: n}
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		m, err := lr.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+m]
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// replayBody serves the buffered prefix then the unread rest (none once
// the buffer is the whole body); Close closes the original body. One
// allocation per request, where bytes.Reader + io.MultiReader took four.
//
// It reads ri's buffer as it is now, not as it was when the replay was
// made: a replay left on the client's request by a reader with a smaller
// bound (flow_control) must give the bytes a larger one read after it
// (the policy, on reverse_proxy's copy), not its old prefix followed by
// the original body, which by then is past them (or, kept by
// custom_router, replays the whole body again).
type replayBody struct {
	ri  *requestInfo
	off int // bytes of ri.buf served
}

func (b *replayBody) Read(p []byte) (int, error) {
	if buf := b.ri.buf; b.off < len(buf) {
		n := copy(p, buf[b.off:])
		b.off += n
		return n, nil
	}
	if b.ri.complete {
		return 0, io.EOF
	}
	return b.ri.rest.Read(p)
}

func (b *replayBody) Close() error { return b.ri.closer.Close() }

// Sizes assumed when the body does not tell.
const (
	// assumedOutputTokens stands for a request that sets no output limit
	// and whose engine then stops at the context length (a chat), or at a
	// limit Sluice does not know (/generate): most answers are short. A
	// completion's engine stops at reqtext.DefaultMaxTokens.
	assumedOutputTokens = 256
	// assumedRequestTokens stands for a body Sluice could not parse: at
	// least, for an inference call's (see estimatedTokens).
	assumedRequestTokens = 512
	// maxEstimatedTokens caps an estimate: a client's max_tokens of 4e18
	// must not close a token gate for everyone (no served model's context
	// is longer than this).
	maxEstimatedTokens = 1 << 20
)

// estimatedTokens is the request's size in tokens as every Sluice module
// weighs it (load_aware's active_tokens, flow control's token
// concurrency): its prompt plus the output it may generate (max_tokens),
// both of which hold KV cache and take engine steps while it runs.
//
// A body Sluice did not parse (over the bound, or one the engine reads and
// Sluice does not: a NaN, a float max_tokens) is weighed by its size on an
// inference path, as a prompt of its bytes would be, and never less than
// assumedRequestTokens: weighed 512, any prompt passed the token gates.
// On other paths (audio, uploads) bytes are not tokens: 512.
func (ri *requestInfo) estimatedTokens() int64 {
	if !ri.Parsed {
		if !ri.inference {
			return assumedRequestTokens
		}
		size := max(int64(len(ri.buf)), ri.declared) // a declared length is a floor: net/http enforces it
		return min(max(assumedRequestTokens, size/4+assumedOutputTokens), maxEstimatedTokens)
	}
	out := ri.MaxTokens
	if out <= 0 {
		out = reqtext.DefaultMaxTokens(ri.Kind)
	}
	if out <= 0 {
		out = assumedOutputTokens
	}
	// Each part capped first: their sum must not overflow.
	return min(min(int64(ri.PromptTokens), maxEstimatedTokens)+min(int64(out), maxEstimatedTokens), maxEstimatedTokens)
}
