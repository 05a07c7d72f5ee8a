package caddymodule

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/flow"
)

// A queued request reads its client's body while it waits (flow_control's
// Queued hook). A client that sends the headers and part of the body, then
// stalls, kept that read blocked: when the request left the queue without
// being dispatched (its TTL ran out, a newcomer pushed it out), the
// refusal was written only once the upload ended or the client gave up,
// and the read went on holding up to max_body_bytes no longer counted
// against max_bytes. These tests stall the upload for good and wait for
// the answer with a generous bound: before the fix no answer ever came.

// stalledPost opens an HTTP/1.1 connection to srv and sends a completion
// request of flow id declaring declared body bytes, of which it sends
// only sent; the connection stays open (the caller closes it).
func stalledPost(t *testing.T, srv *httptest.Server, id string, declared int, sent string) net.Conn {
	t.Helper()
	return stalledPostAt(t, srv.Listener.Addr().String(), id, declared, sent)
}

// stalledPostAt is stalledPost to a proxy's address (host:port).
func stalledPostAt(t *testing.T, addr, id string, declared int, sent string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"%s: %s\r\nContent-Length: %d\r\n\r\n%s", headerFairnessID, id, declared, sent)
	return conn
}

// answerWhileStalled reads the response to a request whose upload is
// still stalled; the bound only says "never", it times nothing.
func answerWhileStalled(t *testing.T, conn net.Conn, what string) *http.Response {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s: no answer while the client's upload is stalled: %v", what, err)
	}
	resp.Body.Close()
	return resp
}

// expiringFlowControl is a flow_control of one slot whose queued requests
// expire after 50 ms, and the next handler it lets requests through to,
// counting them in reached.
func expiringFlowControl(t *testing.T, pool string) (h *FlowControl, next caddyhttp.Handler, reached *atomic.Int64) {
	t.Helper()
	h = &FlowControl{Pool: freshPoolName(pool), MaxConcurrency: 1, Replicas: 1,
		DefaultTTL: caddy.Duration(50 * time.Millisecond)}
	provisionFlowControl(t, h)
	reached = new(atomic.Int64)
	next = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		reached.Add(1)
		return nil
	})
	return h, next, reached
}

func TestFlowControlExpiredRequestAnswersWhileItsUploadStalls(t *testing.T) {
	h, next, reached := expiringFlowControl(t, "fc-s35-ttl")
	held := make(chan int, 1) // bytes the request's state still holds once the handler returned
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
		_ = h.ServeHTTP(w, r, next)
		if rs, _ := requestStateFor(r); rs.info != nil {
			held <- len(rs.info.buf)
		} else {
			held <- -1
		}
	}))
	t.Cleanup(srv.Close)
	ctl := h.state.ctl()
	slot, err := ctl.Enqueue(context.Background(), flow.Request{}) // the pool's one slot
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Release()

	conn := stalledPost(t, srv, "", 1000, `{"model":"m","prompt":"`)
	resp := answerWhileStalled(t, conn, "expired request")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("expired request: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := <-held; n != 0 {
		t.Fatalf("the refused request's state holds %d bytes of its body, want them dropped", n)
	}
	waitFor(t, "the handler to return", func() bool { return h.state.requests.n.Load() == 0 })
	s := ctl.Snapshot()
	if s.Queued != 0 || s.Bytes != 0 || s.InFlight.Requests != 1 || s.Counters.EvictedTTL != 1 || reached.Load() != 0 {
		t.Fatalf("after the expiry: queued %d, bytes %d, in flight %d, counters %+v, reached %d; want only the held slot",
			s.Queued, s.Bytes, s.InFlight.Requests, s.Counters, reached.Load())
	}
}

// A flooding flow's newest request, pushed out of a full band for another
// tenant's, gets its 429 while its upload is stalled; the flow's other
// request, dispatched while its upload is stalled, still reaches the proxy
// with its whole body once the client sends the rest.
func TestFlowControlPushedOutRequestAnswersWhileItsUploadStalls(t *testing.T) {
	h := &FlowControl{Pool: freshPoolName("fc-s35-push"), MaxConcurrency: 1, Replicas: 1,
		DefaultTTL: caddy.Duration(time.Hour), TrustedSources: []string{"127.0.0.1/32"},
		Bands: []FlowBand{{Priority: 0, MaxRequests: 2}}}
	provisionFlowControl(t, h)
	bodies := make(chan string, 2)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		b, err := io.ReadAll(r.Body)
		bodies <- string(b)
		return err
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = h.ServeHTTP(w, r, next) }))
	t.Cleanup(srv.Close) // after the clients' connections close and the slot comes back (cleanups run last first)
	ctl := h.state.ctl()
	held, err := ctl.Enqueue(context.Background(), flow.Request{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Release() })

	const head, tail = `{"model":"m","prompt":"`, `flood"}`
	older := stalledPost(t, srv, "flood", len(head)+len(tail), head)
	waitFor(t, "the flood's first request queued", func() bool { return ctl.Snapshot().Queued == 1 })
	newest := stalledPost(t, srv, "flood", 1000, head)
	waitFor(t, "the flood's second request queued", func() bool { return ctl.Snapshot().Queued == 2 })

	quiet := `{"model":"m","prompt":"quiet"}`
	quietDone := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(quiet))
		req.Header.Set(headerFairnessID, "quiet")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			quietDone <- 0
			return
		}
		resp.Body.Close()
		quietDone <- resp.StatusCode
	}()
	resp := answerWhileStalled(t, newest, "pushed-out request")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("pushed-out request: %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	s := ctl.Snapshot()
	if s.Queued != 2 || s.Bytes != int64(len(head)+len(tail)+len(quiet)) || s.Counters.RejectedCapacity != 1 {
		t.Fatalf("after the push-out: queued %d, bytes %d, counters %+v; want the flood's first and the quiet request",
			s.Queued, s.Bytes, s.Counters)
	}

	// Both left are dispatched in turn; the first one's upload finishes
	// only after it was let in, and its body reaches the proxy whole.
	held.Release()
	waitFor(t, "a request dispatched", func() bool { return ctl.Snapshot().Queued == 1 })
	if _, err := io.WriteString(older, tail); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{<-bodies: true, <-bodies: true}
	if !got[head+tail] || !got[quiet] {
		t.Fatalf("the proxy got %v, want the flood's first body whole and the quiet one", got)
	}
	if r := answerWhileStalled(t, older, "dispatched request"); r.StatusCode != http.StatusOK {
		t.Fatalf("dispatched request: %d", r.StatusCode)
	}
	if c := <-quietDone; c != http.StatusOK {
		t.Fatalf("quiet request: %d", c)
	}
	waitFor(t, "every handler to return and the slot to come back", func() bool {
		s := ctl.Snapshot()
		return h.state.requests.n.Load() == 0 && s.InFlight.Requests == 0 && s.Queued == 0 && s.Bytes == 0
	})
}

// The same over HTTP/2, where the blocked read is a stream's: its refusal
// is written while the client's request body is still open.
func TestFlowControlExpiredRequestAnswersWhileItsUploadStallsHTTP2(t *testing.T) {
	h, next, reached := expiringFlowControl(t, "fc-s35-h2")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = h.ServeHTTP(w, r, next) }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	ctl := h.state.ctl()
	held, err := ctl.Enqueue(context.Background(), flow.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()

	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = io.WriteString(pw, `{"model":"m","prompt":"`) }() // then nothing more
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", pr)
	req.ContentLength = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := srv.Client().Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("expired request: no answer while the client's upload is stalled: %v", err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("expired request: %s %d, Retry-After %q; want HTTP/2 503 with Retry-After", resp.Proto, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	waitFor(t, "the handler to return", func() bool { return h.state.requests.n.Load() == 0 })
	if s := ctl.Snapshot(); s.Queued != 0 || s.Bytes != 0 || s.InFlight.Requests != 1 || reached.Load() != 0 {
		t.Fatalf("after the expiry: queued %d, bytes %d, in flight %d, reached %d; want only the held slot",
			s.Queued, s.Bytes, s.InFlight.Requests, reached.Load())
	}
}

// The same through a real Caddy server (its writers wrap the connection's):
// the pool's one slot is taken by a request the replica holds.
func TestFlowControlExpiredRequestAnswersWhileItsUploadStallsInCaddy(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	dial := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		answerOK(w, r)
	})
	pool := freshPoolName("fc-s35-caddy")
	url := startProxy(t, []map[string]any{{"handle": []map[string]any{
		{"handler": "flow_control", "pool": pool, "max_concurrency": 1, "replicas": 1, "default_ttl": int64(50 * time.Millisecond)},
		{"handler": "reverse_proxy", "upstreams": []map[string]any{{"dial": dial}}},
	}}}, nil)
	first := make(chan int, 1)
	go func() {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi"}`))
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-arrived // it holds the slot: the next one waits
	conn := stalledPostAt(t, strings.TrimPrefix(url, "http://"), "", 1000, `{"model":"m","prompt":"`)
	resp := answerWhileStalled(t, conn, "expired request")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("expired request: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	release <- struct{}{}
	if c := <-first; c != http.StatusOK {
		t.Fatalf("the request holding the slot: %d", c)
	}
}
