package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/lb"
)

type recordingLease struct {
	mu       sync.Mutex
	outcomes []lb.Outcome
}

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
	cases := []struct {
		name    string
		measure latencyMeasure
		set     map[string]any
		want    lb.Outcome
	}{
		{"complete response: last byte", measureAuto,
			map[string]any{keyStatus: 200, keyFirstByte: 10 * time.Millisecond, keyLastByte: 900 * time.Millisecond},
			lb.Outcome{Kind: lb.Success, Latency: 900 * time.Millisecond, Status: 200}},
		{"stream: first byte", measureAuto,
			map[string]any{keyStatus: 200, keyContentType: "text/event-stream; charset=utf-8", keyFirstByte: 10 * time.Millisecond, keyLastByte: 5 * time.Second},
			lb.Outcome{Kind: lb.Success, Latency: 10 * time.Millisecond, Status: 200}},
		{"stream with last_byte", measureLastByte,
			map[string]any{keyStatus: 200, keyContentType: "text/event-stream", keyFirstByte: 10 * time.Millisecond, keyLastByte: 5 * time.Second},
			lb.Outcome{Kind: lb.Success, Latency: 5 * time.Second, Status: 200}},
		{"5xx is a failure", measureAuto,
			map[string]any{keyStatus: 503, keyFirstByte: time.Millisecond, keyLastByte: time.Millisecond},
			lb.Outcome{Kind: lb.Failure, Status: 503}},
		{"4xx is the client's problem, still a served response", measureAuto,
			map[string]any{keyStatus: 400, keyLastByte: 2 * time.Millisecond},
			lb.Outcome{Kind: lb.Success, Latency: 2 * time.Millisecond, Status: 400}},
		{"transport error", measureAuto,
			map[string]any{keyError: errors.New("dial tcp: connection refused")},
			lb.Outcome{Kind: lb.Failure}},
		{"body cut mid-stream", measureLastByte,
			map[string]any{keyStatus: 200, keyFirstByte: time.Millisecond},
			lb.Outcome{Kind: lb.Cancelled, Status: 200}},
		{"client left before any answer", measureAuto, map[string]any{}, lb.Outcome{Kind: lb.Cancelled}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, repl, cancel := newRequest(t)
			a := attemptFor(r, "test", c.measure)
			l := &recordingLease{}
			if !a.begin(l) {
				t.Fatal("begin refused on a live request")
			}
			for k, v := range c.set {
				repl.Set(k, v)
			}
			cancel() // the handler chain returned
			got := waitOutcomes(t, l, 1)
			if got[0] != c.want {
				t.Fatalf("outcome %+v, want %+v", got[0], c.want)
			}
		})
	}
}

func TestAttemptRetryReleasesThePreviousAsFailureExactlyOnce(t *testing.T) {
	r, repl, cancel := newRequest(t)
	a := attemptFor(r, "test", measureAuto)
	first, second := &recordingLease{}, &recordingLease{}
	a.begin(first)
	repl.Set(keyStatus, 200) // stale values from the failed attempt...
	a.retry()
	if got := first.get(); len(got) != 1 || got[0].Kind != lb.Failure {
		t.Fatalf("first attempt released %+v, want one Failure", got)
	}
	if attemptFor(r, "test", measureAuto) != a {
		t.Fatal("a second Select must find the same attempt record")
	}
	a.begin(second) // ...are cleared when the next attempt starts
	cancel()
	if got := waitOutcomes(t, second, 1); got[0].Kind != lb.Cancelled {
		t.Fatalf("second attempt %+v, want Cancelled (no response recorded)", got[0])
	}
	if len(first.get()) != 1 {
		t.Fatal("first attempt released twice")
	}
}

func TestAttemptAfterTheRequestEndedIsReleasedAtOnce(t *testing.T) {
	r, _, cancel := newRequest(t)
	a := attemptFor(r, "test", measureAuto)
	cancel()
	waitFor := time.Now().Add(5 * time.Second)
	for {
		a.mu.Lock()
		closed := a.closed
		a.mu.Unlock()
		if closed || time.Now().After(waitFor) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	l := &recordingLease{}
	if a.begin(l) {
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
