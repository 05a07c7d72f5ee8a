package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/flow"
)

// A request refused as it arrives (its band is full) over HTTP/1 while
// its client's upload is stalled. Before writing a response, net/http
// reads what is left of a small unread request body (under 256 KiB), to
// keep the connection for the next request: the refusal waited for the
// upload, forever for one stalled for good. It must go out at once; the
// connection may then close (its unread bytes cannot be skipped).
func TestRefusalAtArrivalAnswersWhileItsUploadStalls(t *testing.T) {
	h := &FlowControl{Pool: freshPoolName("fc-s36-arrival"), MaxConcurrency: 1, Replicas: 1,
		DefaultTTL: caddy.Duration(time.Hour), Bands: []FlowBand{{Priority: 0, MaxRequests: 1}}}
	provisionFlowControl(t, h)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, err := io.Copy(io.Discard, r.Body)
		return err
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = h.ServeHTTP(w, r, next) }))
	t.Cleanup(srv.Close)
	ctl := h.state.ctl()
	held, err := ctl.Enqueue(context.Background(), flow.Request{}) // the pool's one slot
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Release() })

	// The band's one place is taken by a request whose body came whole.
	const whole = `{"model":"m","prompt":"first"}`
	first := stalledPost(t, srv, "", len(whole), whole)
	waitFor(t, "the first request queued", func() bool { return ctl.Snapshot().Queued == 1 })

	conn := stalledPost(t, srv, "", 1000, `{"model":"m","prompt":"`)
	resp := answerWhileStalled(t, conn, "request refused at arrival")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("refused at arrival: %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if s := ctl.Snapshot(); s.Queued != 1 || s.Counters.RejectedCapacity != 1 {
		t.Fatalf("after the refusal: queued %d, counters %+v; want the first request still queued", s.Queued, s.Counters)
	}

	// The request whose body came whole keeps its keep-alive connection:
	// it is served once the slot comes back, then the same connection
	// carries another request.
	held.Release()
	if r := answerWhileStalled(t, first, "queued request"); r.StatusCode != http.StatusOK {
		t.Fatalf("queued request: %d", r.StatusCode)
	}
	fmt.Fprintf(first, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(whole), whole)
	if r := answerWhileStalled(t, first, "next request on the kept connection"); r.StatusCode != http.StatusOK {
		t.Fatalf("next request on the kept connection: %d", r.StatusCode)
	}
}

// A refusal whose handler goes on for a while after it (reverse_proxy's
// lb_try_duration asks Select again until it ends) must leave no read
// deadline on the connection: net/http's read of a kept connection in the
// background would time out, which it takes for the client gone, and it
// would cancel the connection's context, so every later request on the
// connection would start cancelled.
func TestRefusalLeavesTheConnectionUsable(t *testing.T) {
	var served int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		if served == 1 {
			io.Copy(io.Discard, r.Body) // read whole, as a policy that reads ahead does
			refusal{Status: http.StatusServiceUnavailable, Type: "queue_timeout", Message: "m", RetryAfter: time.Second}.answer(w, r)
			time.Sleep(refusalBodyGrace + 500*time.Millisecond)
			return
		}
		if err := r.Context().Err(); err != nil {
			w.WriteHeader(http.StatusTeapot)
			fmt.Fprintf(w, "started with its context ended: %v", err)
			return
		}
		w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	const body = `{"model":"m","prompt":"x"}`
	conn := stalledPost(t, srv, "", len(body), body)
	if r := answerWhileStalled(t, conn, "refused request"); r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("refused request: %d", r.StatusCode)
	}
	time.Sleep(refusalBodyGrace + time.Second) // the first handler has returned
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if r := answerWhileStalled(t, conn, "next request on the connection"); r.StatusCode != http.StatusOK {
		t.Fatalf("next request on the connection: %d, want 200", r.StatusCode)
	}
}

// The same through Caddy: flow_control's band of one place holds a
// queued request; the next, refused as it arrives with its upload
// stalled, gets its 429 at once.
func TestRefusalAtArrivalAnswersWhileItsUploadStallsInCaddy(t *testing.T) {
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	defer close(release)
	dial := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		answerOK(w, r)
	})
	pool := freshPoolName("fc-s36-arrival-caddy")
	url := startProxy(t, []map[string]any{{"handle": []map[string]any{
		{"handler": "flow_control", "pool": pool, "max_concurrency": 1, "replicas": 1,
			"bands": []map[string]any{{"priority": 0, "max_requests": 1}}},
		{"handler": "reverse_proxy", "upstreams": []map[string]any{{"dial": dial}}},
	}}}, nil)
	codes := make(chan int, 2)
	post := func() {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi"}`))
		if err != nil {
			codes <- 0
			return
		}
		resp.Body.Close()
		codes <- resp.StatusCode
	}
	go post()
	<-arrived // it holds the slot
	go post() // it takes the band's one place
	fc, ok := liveStates("flow_control")[pool].(*flowState)
	if !ok {
		t.Fatalf("no flow_control state for pool %s", pool)
	}
	waitFor(t, "the second request queued", func() bool { return fc.ctl().Snapshot().Queued == 1 })

	conn := stalledPostAt(t, strings.TrimPrefix(url, "http://"), "", 1000, `{"model":"m","prompt":"`)
	resp := answerWhileStalled(t, conn, "request refused at arrival")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("refused at arrival: %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	release <- struct{}{}
	release <- struct{}{}
	for i := 0; i < 2; i++ {
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("a request let in: %d", c)
		}
	}
}

// A refusal answered before the client's body was read is flushed at
// once (answer): it keeps its Content-Length framing, as one written whole.
func TestFlushedRefusalIsSized(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refusal{Status: http.StatusTooManyRequests, Type: "flow_capacity", Message: "full", RetryAfter: time.Second}.answer(w, r)
	}))
	t.Cleanup(srv.Close)
	const body = `{"model":"m","prompt":"x"}`
	conn := stalledPost(t, srv, "", len(body), body)
	resp := answerWhileStalled(t, conn, "refused request")
	if resp.ContentLength <= 0 || len(resp.TransferEncoding) > 0 {
		t.Fatalf("refusal framed with Content-Length %d, Transfer-Encoding %v; want a sized answer", resp.ContentLength, resp.TransferEncoding)
	}
}
