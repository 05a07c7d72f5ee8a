package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// Two first bytes stamped out of order (two attempts' hooks, the later
// reading of the clock storing first) must leave the later one: the
// replica's silence is counted from its last answer, never from an
// earlier one.
func TestLastAnswerKeepsTheLatestOfFirstBytesStampedOutOfOrder(t *testing.T) {
	u := new(firstByteUsual)
	earlier := time.Now()
	later := earlier.Add(time.Second)
	u.observe(time.Millisecond, true, later)
	u.observe(time.Millisecond, true, earlier)
	if got := u.silentUntil(0); got.Before(later) {
		t.Fatalf("silent from %v before the last answer", later.Sub(got))
	}
}

// countingBody counts the bytes read from a request body.
type countingBody struct {
	r io.Reader
	n int
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += n
	return n, err
}
func (b *countingBody) Close() error { return nil }

// A waiting request whose body is declared over the bound leaves it
// unread: reading part of it cannot let net/http notice its client
// leave (that takes the whole body), and held DefaultMaxBodyBytes in
// memory for every such request in the queue (and, kept by
// custom_router, left a handle_errors fallback the body without its
// first 4 MiB).
func TestWaitingLeavesABodyDeclaredOverTheBoundUnread(t *testing.T) {
	size := DefaultMaxBodyBytes + 10
	body := &countingBody{r: strings.NewReader(strings.Repeat("x", size))}
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	r.Body, r.ContentLength = body, int64(size)
	a := &attempt{rs: &requestState{}, waitReq: r, waitReads: true}
	a.Waiting(context.Background())
	if body.n != 0 {
		t.Fatalf("read %d bytes of a body declared %d, over the bound %d", body.n, size, DefaultMaxBodyBytes)
	}
	// One within the bound is read whole, as before.
	small := &countingBody{r: strings.NewReader(strings.Repeat("x", 100<<10))}
	r = httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	r.Body, r.ContentLength = small, 100<<10
	a = &attempt{rs: &requestState{}, waitReq: r, waitReads: true}
	a.Waiting(context.Background())
	if small.n != 100<<10 || !a.rs.info.complete {
		t.Fatalf("read %d bytes of a 100 KiB body (complete %v), want it whole", small.n, a.rs != nil && a.rs.info != nil && a.rs.info.complete)
	}
}

// queued_least_latency (and global_redis_least) never parse the body, so
// the request cannot tell the kind of answer: a streamed request's fast
// first byte must not teach the "whole" usual time, and an attempt of
// unknown kind must not be held to the streams' floor, or a whole answer
// of 11 s after streamed ones is cut at 10 s, as the automatic limit
// promises never to do.
func TestUnparsedRequestsAreNotHeldToTheStreamsUsualFirstByte(t *testing.T) {
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer replica.Close()
	dial := strings.TrimPrefix(replica.URL, "http://")
	p := &QueuedLeastLatency{Pool: freshPoolName("fb-kind")}
	if err := p.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	send := qllSender(t, p, replica.URL)
	for range 20 {
		send(`{"prompt":"hi","max_tokens":1,"stream":true}`)
	}
	usual := p.state.firstByte.of(dial)
	if got, _ := usual.limit(0, false); got != firstByteUnknown {
		t.Fatalf("streamed answers taught the whole answers' usual time: limit %v, want %v (no whole answer seen)", got, firstByteUnknown)
	}
	if got := send(`{"prompt":"write a long story","max_tokens":2000}`); got < firstByteUnknown {
		t.Fatalf("a request of unknown kind after streamed answers only: limit %v, want %v", got, firstByteUnknown)
	}
	if got, _ := usual.limit(0, true); got != firstByteMin {
		t.Fatalf("streamed answers (text/event-stream) not learned as streamed: limit %v, want the floor %v", got, firstByteMin)
	}
}

// qllSender proxies requests through p's Select to the replica at base
// as reverse_proxy would (placeholders set for the attempt, the response
// body read to its end), returning the first-byte limit each attempt was
// given.
func qllSender(t *testing.T, p *QueuedLeastLatency, base string) func(body string) time.Duration {
	dial := strings.TrimPrefix(base, "http://")
	replica := struct{ URL string }{base}
	pool := reverseproxy.UpstreamPool{{Dial: dial, Host: new(reverseproxy.Host)}}
	return func(body string) time.Duration {
		r, repl, cancel := requestTo(t, replica.URL+"/v1/completions")
		defer cancel()
		r.Method = http.MethodPost
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
		if p.Select(pool, r, nil) == nil {
			t.Fatal("no upstream")
		}
		rs, _ := requestStateFor(r)
		a := rs.attempt(p.varKey)
		a.mu.Lock()
		limit := a.trace.limit
		a.mu.Unlock()
		repl.Set(keyHostport, dial) // as reverse_proxy does for the attempt
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil {
			t.Fatal(err)
		}
		repl.Set(keyStatus, resp.StatusCode)
		repl.Set(keyContentType, resp.Header.Get("Content-Type"))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return limit
	}
}

// A replica's refusals and server errors (a fast 429 or 503) teach its
// usual time to first byte nothing: learned, they made it short, and its
// next healthy whole answers were cut at the floor.
func TestErrorAnswersDoNotTeachTheUsualFirstByte(t *testing.T) {
	var n atomic.Int64
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if n.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		io.WriteString(w, `{"error":"busy"}`)
	}))
	defer replica.Close()
	p := &QueuedLeastLatency{Pool: freshPoolName("fb-errors"), passiveHealth: passiveHealth{MaxFails: 1000}} // the 503s keep it up
	if err := p.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	send := qllSender(t, p, replica.URL)
	for range 20 {
		send(`{"prompt":"hi"}`)
	}
	if got, _ := p.state.firstByte.of(strings.TrimPrefix(replica.URL, "http://")).limit(0, false); got != firstByteUnknown {
		t.Fatalf("after only 429 and 503 answers: whole answers' limit %v, want %v (no answer learned)", got, firstByteUnknown)
	}
}
