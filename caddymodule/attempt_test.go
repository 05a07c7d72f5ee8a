package caddymodule

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb"
)

type recordingLease struct {
	mu       sync.Mutex
	addr     string
	outcomes []lb.Outcome
}

func (l *recordingLease) Replica() string { return l.addr }

func (l *recordingLease) Release(o lb.Outcome) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.outcomes = append(l.outcomes, o)
	return len(l.outcomes) == 1
}

func (l *recordingLease) get() []lb.Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lb.Outcome(nil), l.outcomes...)
}

// newRequest builds a request the way Caddy's server does: a Replacer and
// a vars map in a cancellable context.
func newRequest(t *testing.T) (*http.Request, *caddy.Replacer, context.CancelFunc) {
	repl := caddy.NewReplacer()
	ctx, cancel := context.WithCancel(context.Background())
	ctx = context.WithValue(ctx, caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil).WithContext(ctx)
	t.Cleanup(cancel)
	return r, repl, cancel
}

// requestTo is newRequest for a round trip to base (a test server's URL),
// as reverse_proxy sends it: no RequestURI, the replica as Host.
func requestTo(t *testing.T, base string) (*http.Request, *caddy.Replacer, context.CancelFunc) {
	r, repl, cancel := newRequest(t)
	r.URL, _ = url.Parse(base)
	r.RequestURI, r.Host = "", r.URL.Host
	return r, repl, cancel
}

// roundTripWhole sends r and reads the response body to its end, as
// reverse_proxy does for a response it copies to the client.
func roundTripWhole(t *testing.T, r *http.Request) {
	t.Helper()
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
}

func waitOutcomes(t *testing.T, l *recordingLease, n int) []lb.Outcome {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(l.get()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("lease released %d times, want %d", len(l.get()), n)
		}
		time.Sleep(time.Millisecond)
	}
	return l.get()
}

func TestAttemptOutcomeClassification(t *testing.T) {
	const dial = "10.0.0.1:8000"
	ms := time.Millisecond
	cases := []struct {
		name        string
		measure     latencyMeasure
		first, last time.Duration // what the attempt's trace saw
		transport   bool          // the trace saw a transport error
		set         map[string]any
		want        lb.Outcome
	}{
		{"complete response: last byte", measureAuto, 10 * ms, 900 * ms, false,
			map[string]any{keyHostport: dial, keyStatus: 200},
			lb.Outcome{Kind: lb.Success, Latency: 900 * ms, Total: 900 * ms, Status: 200}},
		{"stream: first byte", measureAuto, 10 * ms, 5 * time.Second, false,
			map[string]any{keyHostport: dial, keyStatus: 200, keyContentType: "text/event-stream; charset=utf-8"},
			lb.Outcome{Kind: lb.Success, Latency: 10 * ms, Streamed: true, Total: 5 * time.Second, Status: 200}},
		{"stream with last_byte", measureLastByte, 10 * ms, 5 * time.Second, false,
			map[string]any{keyHostport: dial, keyStatus: 200, keyContentType: "text/event-stream"},
			lb.Outcome{Kind: lb.Success, Latency: 5 * time.Second, Total: 5 * time.Second, Status: 200}},
		{"5xx is a failure", measureAuto, ms, ms, false,
			map[string]any{keyHostport: dial, keyStatus: 503},
			lb.Outcome{Kind: lb.Failure, Status: 503}},
		{"4xx is the client's problem, still a served response", measureAuto, ms, 2 * ms, false,
			map[string]any{keyHostport: dial, keyStatus: 400},
			lb.Outcome{Kind: lb.Success, Latency: 2 * ms, Total: 2 * ms, Status: 400}},
		{"transport error seen by the attempt's trace", measureAuto, 0, 0, true,
			map[string]any{}, lb.Outcome{Kind: lb.Failure}},
		{"no answer and the chain ended in an error", measureAuto, 0, 0, false,
			map[string]any{keyError: errors.New("502: connection reset")}, lb.Outcome{Kind: lb.Failure}},
		{"dead replica, then handle_errors proxied elsewhere with a 200", measureAuto, 0, 0, true,
			map[string]any{keyHostport: "10.0.0.9:8000", keyStatus: 200, keyLastByte: ms, keyError: errors.New("dial refused")},
			lb.Outcome{Kind: lb.Failure}},
		{"answered, then another proxy overwrote status 503 and timings", measureLastByte, 5 * ms, 40 * ms, false,
			map[string]any{keyHostport: "10.0.0.9:8000", keyStatus: 503, keyLastByte: time.Hour},
			lb.Outcome{Kind: lb.Success, Latency: 40 * ms, Total: 40 * ms}},
		{"body cut mid-stream", measureLastByte, ms, 0, false,
			map[string]any{keyHostport: dial, keyStatus: 200},
			lb.Outcome{Kind: lb.Cancelled, Status: 200}},
		{"HTTP/2 upstream: body end from reverse_proxy's own duration", measureLastByte, ms, 0, false,
			map[string]any{keyHostport: dial, keyStatus: 200, keyLastByte: 30 * ms},
			lb.Outcome{Kind: lb.Success, Latency: 30 * ms, Total: 30 * ms, Status: 200}},
		{"client left before any answer", measureAuto, 0, 0, false, map[string]any{}, lb.Outcome{Kind: lb.Cancelled}},
	}
	// A truncated upload fails the attempt through no fault of the replica.
	r, repl, _ := newRequest(t)
	repl.Set(keyError, errors.New("502: unexpected EOF"))
	tr := &attemptTrace{base: context.Background(), transportErr: true, clientErr: true}
	if got := attemptFor(r, "test", measureAuto).outcome(dial, tr); got.Kind != lb.Cancelled {
		t.Fatalf("truncated upload: %+v, want Cancelled", got)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, repl, _ := newRequest(t)
			a := attemptFor(r, "test", c.measure)
			for k, v := range c.set {
				repl.Set(k, v)
			}
			tr := &attemptTrace{base: context.Background(), firstByte: c.first, lastByte: c.last, transportErr: c.transport}
			if got := a.outcome(dial, tr); got != c.want {
				t.Fatalf("outcome %+v, want %+v", got, c.want)
			}
		})
	}
}

// The trace Select attaches reports on the attempt's own round trip.
func TestAttemptTraceTimesTheRealRoundTrip(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	dial := strings.TrimPrefix(srv.URL, "http://")

	r, repl, cancel := requestTo(t, srv.URL)
	a := attemptFor(r, "test", measureLastByte)
	l := &recordingLease{addr: dial}
	if !a.begin(l, r, firstByteRule{}) {
		t.Fatal("begin refused a live request")
	}
	repl.Set(keyStatus, 200)
	repl.Set(keyHostport, dial)
	roundTripWhole(t, r)
	cancel()
	got := waitOutcomes(t, l, 1)[0]
	if got.Kind != lb.Success || got.Latency <= 0 {
		t.Fatalf("outcome %+v, want a Success timed by the trace", got)
	}

	// A refused connection is this attempt's failure: reverse_proxy
	// gives up on it, and Caddy's server sets {http.error} before the
	// request ends. A status placeholder left from elsewhere changes
	// nothing.
	r2, repl2, cancel2 := newRequest(t)
	r2.URL, _ = url.Parse("http://127.0.0.1:1/")
	r2.RequestURI = ""
	a2 := attemptFor(r2, "test", measureLastByte)
	l2 := &recordingLease{addr: "127.0.0.1:1"}
	a2.begin(l2, r2, firstByteRule{})
	_, err := http.DefaultTransport.RoundTrip(r2)
	if err == nil {
		t.Fatal("dial to port 1 succeeded")
	}
	repl2.Set(keyStatus, 200)
	repl2.Set(keyError, err)
	cancel2()
	if got := waitOutcomes(t, l2, 1)[0]; got.Kind != lb.Failure {
		t.Fatalf("outcome %+v, want Failure", got)
	}
}

// firstByteLease is a lease that learns from its first byte, as qll's.
type firstByteLease struct {
	recordingLease
	firstBytes []time.Duration
}

func (l *firstByteLease) FirstByte(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.firstBytes = append(l.firstBytes, d)
}

// A lease that learns from its first byte (qll's) is told it once, when
// the replica's answer begins; the replica's usual time to first byte,
// which sets the next attempts' limit, learns it too.
func TestAttemptTellsItsLeaseAndTheReplicaItsFirstByte(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	dial := strings.TrimPrefix(srv.URL, "http://")

	var stats firstByteStats
	r, _, cancel := requestTo(t, srv.URL)
	a := attemptFor(r, "test", measureLastByte)
	l := &firstByteLease{recordingLease: recordingLease{addr: dial}}
	if !a.begin(l, r, firstByteRule{usual: stats.of(dial)}) {
		t.Fatal("begin refused a live request")
	}
	roundTripWhole(t, r)
	cancel()
	waitOutcomes(t, &l.recordingLease, 1)
	l.mu.Lock()
	got := append([]time.Duration(nil), l.firstBytes...)
	l.mu.Unlock()
	if len(got) != 1 || got[0] <= 0 {
		t.Fatalf("lease told first bytes %v, want one, positive", got)
	}
	if limit, _ := stats.of(dial).limit(0, false); limit != firstByteMin {
		t.Fatalf("limit after a fast first byte %v, want the floor %v (not the %v of a replica never heard)", limit, firstByteMin, firstByteUnknown)
	}
}

func TestAttemptRetryReleasesThePreviousAsFailureExactlyOnce(t *testing.T) {
	r, repl, cancel := newRequest(t)
	a := attemptFor(r, "test", measureAuto)
	first, second := &recordingLease{}, &recordingLease{}
	a.begin(first, r, firstByteRule{})
	repl.Set(keyStatus, 200) // stale values from the failed attempt...
	a.retry()
	if got := first.get(); len(got) != 1 || got[0].Kind != lb.Failure {
		t.Fatalf("first attempt released %+v, want one Failure", got)
	}
	if attemptFor(r, "test", measureAuto) != a {
		t.Fatal("a second Select must find the same attempt record")
	}
	a.begin(second, r, firstByteRule{}) // ...are cleared when the next attempt starts
	cancel()
	if got := waitOutcomes(t, second, 1); got[0].Kind != lb.Cancelled {
		t.Fatalf("second attempt %+v, want Cancelled (no response recorded)", got[0])
	}
	if len(first.get()) != 1 {
		t.Fatal("first attempt released twice")
	}
}

// After the replica's body was read to its end the attempt is released at
// once and the end-of-request hook is disarmed; a later attempt on the
// same request (a handle_response proxy through the same policy) must
// arm it again, or its lease would never be released.
func TestAttemptAfterAnEarlyReleaseIsReleasedAtTheRequestsEnd(t *testing.T) {
	r, repl, cancel := newRequest(t)
	a := attemptFor(r, "test", measureLastByte)
	first, second := &recordingLease{addr: "10.0.0.1:1"}, &recordingLease{addr: "10.0.0.2:1"}
	if !a.begin(first, r, firstByteRule{}) {
		t.Fatal("begin refused a live request")
	}
	tr := a.trace
	tr.mu.Lock()
	tr.firstByte, tr.lastByte = time.Millisecond, 2*time.Millisecond
	tr.mu.Unlock()
	repl.Set(keyHostport, "10.0.0.1:1")
	repl.Set(keyStatus, 200)
	a.bodyRead(tr)
	if got := first.get(); len(got) != 1 || got[0].Kind != lb.Success {
		t.Fatalf("first attempt released %+v, want one Success at its body's end", got)
	}
	if !a.begin(second, r, firstByteRule{}) {
		t.Fatal("begin refused a second attempt on a live request")
	}
	cancel()
	if got := waitOutcomes(t, second, 1); got[0].Kind != lb.Cancelled {
		t.Fatalf("second attempt %+v, want Cancelled at the request's end", got[0])
	}
	if len(first.get()) != 1 {
		t.Fatal("first attempt released twice")
	}
}

func TestAttemptAfterTheRequestEndedIsReleasedAtOnce(t *testing.T) {
	r, _, cancel := newRequest(t)
	a := attemptFor(r, "test", measureAuto)
	cancel()
	l := &recordingLease{}
	if a.begin(l, r, firstByteRule{}) {
		t.Fatal("begin accepted an attempt on a finished request")
	}
	if got := l.get(); len(got) != 1 || got[0].Kind != lb.Cancelled {
		t.Fatalf("late lease released %+v, want one Cancelled", got)
	}
}

func TestRefusalIsWrittenOnceWithJSONAndRetryAfter(t *testing.T) {
	r, _, _ := newRequest(t)
	a := attemptFor(r, "test", measureAuto)
	rf, ok := refusalFor(lb.ErrQueueTimeout, 2500*time.Millisecond)
	if !ok {
		t.Fatal("queue timeout must be answered")
	}
	w := httptest.NewRecorder()
	a.refuse(r, w, rf)
	a.refuse(r, w, rf)
	if w.Code != 503 || w.Header().Get("Retry-After") != "3" || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("got %d Retry-After %q CT %q", w.Code, w.Header().Get("Retry-After"), w.Header().Get("Content-Type"))
	}
	if body := w.Body.String(); body != `{"error":{"message":"timed out waiting in the queue","type":"queue_timeout"}}`+"\n" {
		t.Fatalf("body %q (written twice?)", body)
	}
	if !a.wasRefused() || caddyhttp.GetVar(r.Context(), refusedVar) != "queue_timeout" {
		t.Fatal("refusal not recorded")
	}
	if _, ok := refusalFor(context.Canceled, 0); ok {
		t.Fatal("a client that left gets no answer")
	}
}

// A request that ends while its attempt begins (the client left within
// microseconds) must not leave the attempt in the first-byte watch: it
// would keep the trace, and abandon it, minutes after the request is gone.
func TestFirstByteWatchNeverOutlivesTheRequest(t *testing.T) {
	const n = 3000
	leftWatched := 0
	for i := 0; i < n; i++ {
		r, _, cancel := newRequest(t)
		r.Body = io.NopCloser(strings.NewReader("{}")) // begin wraps it: the wrapper names the trace
		a := attemptFor(r, "k", measureAuto)
		go cancel() // the client leaves as the attempt begins
		l := &recordingLease{addr: "r:1"}
		if !a.begin(l, r, firstByteRule{limit: time.Hour}) {
			continue
		}
		// The end-of-request hook closes the trace, then releases.
		waitOutcomes(t, l, 1)
		tr := r.Body.(*clientBody).t
		firstByteWatched.mu.Lock()
		if tr.watched {
			leftWatched++
		}
		firstByteWatched.mu.Unlock()
	}
	if leftWatched > 0 {
		t.Fatalf("%d of %d attempts stayed in the first-byte watch after the request ended", leftWatched, n)
	}
}

// An attempt with no first byte within its limit is abandoned: its
// context ends with a timeout (reverse_proxy answers 504) and it is the
// replica's failure. Attempts with a later deadline, or that got their
// first byte, are left alone, and every attempt leaves the watch.
func TestFirstByteLimitAbandonsOnlyTheHungAttempt(t *testing.T) {
	begin := func(limit time.Duration) (*http.Request, *recordingLease, *attemptTrace, context.CancelFunc) {
		r, _, cancel := newRequest(t)
		r.Body = io.NopCloser(strings.NewReader("{}"))
		a := attemptFor(r, "k", measureLastByte)
		l := &recordingLease{addr: "r:1"}
		if !a.begin(l, r, firstByteRule{limit: limit}) {
			t.Fatal("begin refused a live request")
		}
		return r, l, r.Body.(*clientBody).t, cancel
	}
	// The long limit first: the short one must re-arm the watch earlier.
	rLong, lLong, trLong, cancelLong := begin(time.Hour)
	rAnswered, lAnswered, trAnswered, cancelAnswered := begin(20 * time.Millisecond)
	trAnswered.hooks.GotFirstResponseByte()
	rHung, lHung, _, cancelHung := begin(20 * time.Millisecond)

	select {
	case <-rHung.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the hung attempt was not abandoned")
	}
	if err := rHung.Context().Err(); !errors.Is(err, errFirstByteTimeout) {
		t.Fatalf("hung attempt's context ended with %v, want the first-byte timeout", err)
	}
	var ne interface{ Timeout() bool }
	if !errors.As(rHung.Context().Err(), &ne) || !ne.Timeout() {
		t.Fatal("the first-byte timeout must read as a timeout (reverse_proxy's 504)")
	}
	cancelHung()
	if got := waitOutcomes(t, lHung, 1); got[0].Kind != lb.Failure {
		t.Fatalf("hung attempt released %+v, want Failure", got[0])
	}

	// The answered one outlived its limit untouched; the long one waits.
	time.Sleep(50 * time.Millisecond)
	if rAnswered.Context().Err() != nil || rLong.Context().Err() != nil {
		t.Fatalf("abandoned too: answered %v, long %v", rAnswered.Context().Err(), rLong.Context().Err())
	}
	firstByteWatched.mu.Lock()
	longWatched, answeredWatched := trLong.watched, trAnswered.watched
	firstByteWatched.mu.Unlock()
	if !longWatched || answeredWatched {
		t.Fatalf("watched: long %v (want true), answered %v (want false)", longWatched, answeredWatched)
	}
	cancelAnswered()
	cancelLong()
	waitOutcomes(t, lAnswered, 1)
	if got := waitOutcomes(t, lLong, 1); got[0].Kind != lb.Cancelled {
		t.Fatalf("long attempt released %+v, want Cancelled (the client left)", got[0])
	}
	firstByteWatched.mu.Lock()
	longWatched = trLong.watched
	firstByteWatched.mu.Unlock()
	if longWatched {
		t.Fatal("an ended attempt stayed in the first-byte watch")
	}
}

// A second reverse_proxy on the same pool in handle_response calls Select
// again after the replica answered: that is no retry, and the answered
// attempt must not be released as the replica's failure (nor avoided).
func TestSecondProxyAfterAnAnswerIsNoFailure(t *testing.T) {
	r, repl, cancel := newRequest(t)
	defer cancel()
	r.Body = io.NopCloser(strings.NewReader("{}"))
	a := attemptFor(r, "test", measureAuto)
	first := &recordingLease{addr: "10.0.0.1:1"}
	if !a.begin(first, r, firstByteRule{}) {
		t.Fatal("begin refused a live request")
	}
	tr := r.Body.(*clientBody).t
	tr.hooks.GotFirstResponseByte() // the replica answered...
	repl.Set(keyStatus, 200)
	repl.Set(keyHostport, "10.0.0.1:1") // ...and handle_response matched it
	if startAttempt(r, "test", measureAuto) == nil {
		t.Fatal("the second proxy's Select was refused")
	}
	if got := first.get(); len(got) != 1 || got[0].Kind == lb.Failure {
		t.Fatalf("the answered attempt was released as %+v, want one release that is no Failure", got)
	}
	if len(a.failed) != 0 {
		t.Fatalf("the answered replica is avoided: %v", a.failed)
	}
}

// reverse_proxy wraps the attempt's context in values before the round
// trip, and the transport makes its own child of that: the child must
// join the attempt's context, not get a goroutine of its own to watch it
// (an attempt context of Sluice's own type, hidden behind the values,
// cost one goroutine per attempt); and an attempt abandoned at its
// first-byte limit ends the transport's child with the timeout (the error
// the transport returns, which reverse_proxy answers with 504); the
// client leaving ends it too, and the request's values read through it.
func TestTransportsChildContextJoinsTheAttempts(t *testing.T) {
	type dialInfoKey struct{}
	const n = 200
	before := runtime.NumGoroutine()
	var children []context.Context
	var traces []*attemptTrace
	var ends []context.CancelFunc
	for range n {
		r, repl, end := newRequest(t)
		ends = append(ends, end)
		r.Body = io.NopCloser(strings.NewReader("{}"))
		a := attemptFor(r, "k", measureLastByte)
		if !a.begin(&recordingLease{addr: "r:1"}, r, firstByteRule{limit: time.Hour}) {
			t.Fatal("begin refused a live request")
		}
		traces = append(traces, r.Body.(*clientBody).t)
		ctx := context.WithValue(r.Context(), dialInfoKey{}, "r:1")
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{})
		child, cancel := context.WithCancelCause(ctx)
		t.Cleanup(func() { cancel(nil) })
		children = append(children, child)
		if child.Value(caddy.ReplacerCtxKey) != repl {
			t.Fatal("the request's Replacer is not found through the attempt's context")
		}
	}
	if grown := runtime.NumGoroutine() - before; grown >= n/2 {
		t.Fatalf("%d goroutines more after %d round-trip contexts: the transport's child watches the attempt in a goroutine", grown, n)
	}
	traces[0].expire()
	select {
	case <-children[0].Done():
	case <-time.After(5 * time.Second):
		t.Fatal("an abandoned attempt left the transport's context running")
	}
	if err := context.Cause(children[0]); !errors.Is(err, errFirstByteTimeout) {
		t.Fatalf("transport's context ended with %v, want the first-byte timeout", err)
	}
	if children[1].Err() != nil {
		t.Fatal("abandoning one attempt ended another's transport context")
	}
	ends[1]() // the client leaves
	select {
	case <-children[1].Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the client left and the transport's context kept running")
	}
	if err := context.Cause(children[1]); !errors.Is(err, context.Canceled) {
		t.Fatalf("transport's context ended with %v after the client left, want context.Canceled", err)
	}
	if children[2].Err() != nil {
		t.Fatal("one client leaving ended another's transport context")
	}
}

// outcome is the attempt's outcome as its end would classify it.
func (a *attempt) outcome(dial string, t *attemptTrace) lb.Outcome {
	a.mu.Lock()
	kept := a.kept
	a.mu.Unlock()
	o, _, _ := a.classify(dial, t, kept)
	return o
}

// A request still queued when a reload or a stop destroys its state gets
// a retryable answer: the new config, or another instance, serves it. 500
// read as Sluice's own bug, and without Retry-After clients gave up.
func TestShutdownIsARetryableRefusal(t *testing.T) {
	for _, err := range []error{lb.ErrShutdown, flow.ErrShutdown} {
		rf, ok := refusalFor(err, 0)
		if !ok || rf.Status != http.StatusServiceUnavailable || rf.Type != "shutdown" || rf.RetryAfter != time.Second {
			t.Fatalf("%v: answered %+v, want 503 shutdown with Retry-After 1s", err, rf)
		}
	}
}
