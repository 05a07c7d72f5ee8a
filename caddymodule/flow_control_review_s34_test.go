package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/flow"
)

// onlyReader hides a reader's length, so the client sends it chunked
// (no Content-Length).
type onlyReader struct{ io.Reader }

// A body of unknown size (chunked) counts against the band's max_bytes
// what is held of it, and a request refused at the limit answers 429
// flow_capacity with Retry-After and holds nothing afterwards: neither a
// queue place, nor bytes, nor a slot.
func TestFlowControlChunkedBodiesCountAgainstTheBandBytes(t *testing.T) {
	h := &FlowControl{Pool: "fc-s34-chunked", MaxConcurrency: 1, Replicas: 1,
		Bands: []FlowBand{{Priority: 0, MaxBytes: "1500"}}, bodyOptions: bodyOptions{MaxBodyBytes: 1 << 10}}
	provisionFlowControl(t, h)
	got := make(chan int, 2)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		b, err := io.ReadAll(r.Body)
		got <- len(b)
		return err
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = h.ServeHTTP(w, r, next) }))
	defer srv.Close()
	ctl := h.state.ctl()
	held, err := ctl.Enqueue(context.Background(), flow.Request{})
	if err != nil {
		t.Fatal(err)
	}
	post := func(size int) <-chan *http.Response {
		ch := make(chan *http.Response, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", onlyReader{strings.NewReader(strings.Repeat("x", size))})
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				ch <- nil
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ch <- resp
		}()
		return ch
	}
	first := post(800)
	waitFor(t, "the chunked request queued", func() bool { return ctl.Snapshot().Queued == 1 })
	if b := ctl.Snapshot().Bytes; b != 800 {
		t.Fatalf("a queued 800-byte chunked body counts %d bytes", b)
	}
	// 800 + 701 > 1500: refused at once.
	resp := <-post(701)
	if resp == nil {
		return
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over the band's max_bytes: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	s := ctl.Snapshot()
	if s.Queued != 1 || s.Bytes != 800 || s.InFlight.Requests != 1 || s.Counters.RejectedCapacity != 1 {
		t.Fatalf("the refused request left a trace: %+v", s)
	}
	waitFor(t, "the refused request to leave the handler", func() bool { return h.state.requests.n.Load() == 1 })
	held.Release()
	if n := <-got; n != 800 {
		t.Fatalf("the queued request reached the proxy with %d bytes, want 800", n)
	}
	if r := <-first; r != nil && r.StatusCode != http.StatusOK {
		t.Fatalf("queued request: %d", r.StatusCode)
	}
	waitFor(t, "the slot to come back", func() bool { return ctl.Snapshot().InFlight.Requests == 0 })
}
