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

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/flow"
)

// provisionFlowControl provisions h on its own (no config: its settings
// apply at once) and cleans it up when the test ends.
func provisionFlowControl(t *testing.T, h *FlowControl) {
	t.Helper()
	if err := h.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
}

// flowServer serves h in front of a handler that counts the requests it
// reaches.
func flowServer(t *testing.T, h *FlowControl, reached *atomic.Int64) *httptest.Server {
	t.Helper()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		reached.Add(1)
		return nil
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = h.ServeHTTP(w, r, next)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fullFlowControl serves a flow_control of pool over one replica with one
// slot (queued requests wait an hour), its slot taken by the returned
// ticket; reached counts the requests that got through.
func fullFlowControl(t *testing.T, pool string) (srv *httptest.Server, ctl *flow.Controller, held *flow.Ticket, reached *atomic.Int64) {
	t.Helper()
	h := &FlowControl{Pool: pool, MaxConcurrency: 1, Replicas: 1, DefaultTTL: caddy.Duration(time.Hour)}
	provisionFlowControl(t, h)
	reached = new(atomic.Int64)
	srv = flowServer(t, h, reached)
	ctl = h.state.ctl()
	held, err := ctl.Enqueue(context.Background(), flow.Request{}) // the pool's one slot
	if err != nil {
		t.Fatal(err)
	}
	return srv, ctl, held, reached
}

// waitFor polls cond; the deadline only keeps a broken build from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// An HTTP/1.1 client that sends a request with a body (every inference
// call) and gives up while it is queued must leave the queue at once.
// net/http notices a closed connection only once the handler has read the
// request's body, so a queued request whose body nobody read kept its
// place until its TTL (an hour here), counted against the band's limits,
// and was then sent to a replica for nobody.
func TestFlowControlQueuedClientThatLeavesLeavesTheQueue(t *testing.T) {
	srv, ctl, held, reached := fullFlowControl(t, "fc-review-gone")
	defer held.Release()

	body := `{"model":"m","prompt":"hi"}`
	conn := postHTTP1(t, srv, len(body), body)
	waitFor(t, "the request queued", func() bool { return ctl.Snapshot().Queued == 1 })
	conn.Close()
	waitFor(t, "the request of the client that left to leave the queue", func() bool { return ctl.Snapshot().Queued == 0 })
	if n := ctl.Snapshot().Counters; n.EvictedContextCancelled != 1 || n.Dispatched != 1 {
		t.Fatalf("counters %+v: want the held request dispatched and the queued one evicted as cancelled", n)
	}
	held.Release()
	if reached.Load() != 0 {
		t.Fatalf("%d requests reached the proxy, want none", reached.Load())
	}
}

// The body a queued request read while it waited (see the test above) is
// the one the proxy sends once it is let in, whole, whether it fit the
// read bound or not.
func TestFlowControlQueuedRequestKeepsItsBody(t *testing.T) {
	h := &FlowControl{Pool: "fc-review-body", MaxConcurrency: 1, Replicas: 1, bodyOptions: bodyOptions{MaxBodyBytes: 1 << 10}}
	provisionFlowControl(t, h)
	got := make(chan string, 1)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		got <- string(b)
		return nil
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = h.ServeHTTP(w, r, next) }))
	defer srv.Close()
	ctl := h.state.ctl()
	for _, size := range []int{100, 1 << 10, 1<<10 + 1, 64 << 10} {
		held, err := ctl.Enqueue(context.Background(), flow.Request{})
		if err != nil {
			t.Fatal(err)
		}
		body := strings.Repeat("x", size)
		done := make(chan error, 1)
		go func() {
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		waitFor(t, "the request queued", func() bool { return ctl.Snapshot().Queued == 1 })
		held.Release()
		if b := <-got; b != body {
			t.Fatalf("%d-byte body: the proxy got %d bytes", size, len(b))
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// An invalid value refuses the config with an error that names the
// directive as the user wrote it (Caddyfile and JSON share the names).
func TestFlowControlInvalidValueNamesItsDirective(t *testing.T) {
	neg := caddy.Duration(-time.Second)
	cases := []struct {
		directive string
		h         FlowControl
	}{
		{"max_requests", FlowControl{MaxRequests: -1}},
		{"max_bytes", FlowControl{MaxBytes: "lots"}},
		{"default_ttl", FlowControl{DefaultTTL: neg}},
		{"detector", FlowControl{Detector: "magic"}},
		{"max_concurrency", FlowControl{MaxConcurrency: -1}},
		{"concurrency_mode", FlowControl{ConcurrencyMode: "bytes"}},
		{"max_token_concurrency", FlowControl{MaxTokenConcurrency: -1}},
		{"headroom", FlowControl{Headroom: 2}},
		{"queue_depth_threshold", FlowControl{QueueDepthThreshold: -1}},
		{"kv_cache_threshold", FlowControl{KVCacheThreshold: 2}},
		{"metrics_staleness", FlowControl{MetricsStaleness: neg}},
		{"metrics_interval", FlowControl{MetricsInterval: neg}},
		{"replicas", FlowControl{Replicas: -1}},
		{"trusted_sources", FlowControl{TrustedSources: []string{"10.0.0.0/99"}}},
		{"ttl", FlowControl{Bands: []FlowBand{{TTL: neg}}}},
		{"fairness", FlowControl{Bands: []FlowBand{{Fairness: "fifo"}}}},
		{"ordering", FlowControl{Bands: []FlowBand{{Ordering: "lifo"}}}},
	}
	for _, tc := range cases {
		err := tc.h.Validate()
		if err == nil {
			t.Errorf("%s: invalid value accepted", tc.directive)
			continue
		}
		// The directive's name, as a whole word (not inside another name).
		msg := " " + strings.NewReplacer(".", " ", ":", " ").Replace(err.Error()) + " "
		if !strings.Contains(msg, " "+tc.directive+" ") {
			t.Errorf("%s: error %q does not name the directive", tc.directive, err)
		}
		for _, other := range []string{"max_body_bytes"} {
			if other != tc.directive && strings.Contains(err.Error(), other) {
				t.Errorf("%s: error %q also names %s, which is not at fault", tc.directive, err, other)
			}
		}
	}
}

// A queued request counts against max_bytes what Sluice may hold of its
// body (at most max_body_bytes: the rest stays in the client's socket),
// not the length it declares: one client declaring a 999,999,990-byte body, sent or
// not, filled the default band's 1G budget and every other client of the
// band got 429 until it left.
func TestFlowControlDeclaredLengthDoesNotFillTheBand(t *testing.T) {
	srv, ctl, held, _ := fullFlowControl(t, "fc-review-declared")
	defer held.Release()

	conn := postHTTP1(t, srv, 999999990, `{"prompt":`)
	defer conn.Close()
	waitFor(t, "the large request queued", func() bool { return ctl.Snapshot().Queued == 1 })

	status := make(chan int, 1)
	go func() {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi"}`))
		if err != nil {
			status <- 0
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	for ctl.Snapshot().Queued != 2 {
		select {
		case s := <-status:
			t.Fatalf("a small request answered %d while one declared 999,999,990 bytes waited (queued bytes %d), want it queued",
				s, ctl.Snapshot().Bytes)
		case <-time.After(time.Millisecond):
		}
	}
	if b := ctl.Snapshot().Bytes; b > DefaultMaxBodyBytes+100 {
		t.Fatalf("queued bytes %d, want at most max_body_bytes (%d) for the large request and a few for the small one", b, DefaultMaxBodyBytes)
	}
	held.Release()
}
