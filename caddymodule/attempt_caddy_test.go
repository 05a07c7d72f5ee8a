package caddymodule

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb/qll"
)

// These tests run Caddy's own reverse_proxy in process (admin off) in
// front of real replicas, so the attempt sees the transport's and
// reverse_proxy's real order of events.

// startProxy loads a Caddy config with one server on a free loopback port
// whose routes are routes; it returns the server's URL.
func startProxy(t *testing.T, routes []map[string]any, errorRoutes []map[string]any) string {
	t.Helper()
	goldenTempDirs(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := map[string]any{"listen": []string{addr}, "routes": routes}
	if errorRoutes != nil {
		srv["errors"] = map[string]any{"routes": errorRoutes}
	}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"apps":    map[string]any{"http": map[string]any{"servers": map[string]any{"proxy": srv}}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(b, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	return "http://" + addr
}

// qllProxy is a reverse_proxy route to upstreams through a
// queued_least_latency policy on pool.
func qllProxy(pool string, upstreams ...string) map[string]any {
	ups := make([]map[string]any, len(upstreams))
	for i, u := range upstreams {
		ups[i] = map[string]any{"dial": u}
	}
	return map[string]any{"handle": []map[string]any{{
		"handler":   "reverse_proxy",
		"upstreams": ups,
		"load_balancing": map[string]any{"selection_policy": map[string]any{
			"policy": "queued_least_latency", "pool": pool,
			"engine_metrics": "off", "state_log_interval": -1,
		}},
	}}}
}

// qllReplica is pool's queued_least_latency view of the replica at dial,
// once it has no request in flight.
func qllReplica(t *testing.T, pool, dial string) qll.ReplicaSnapshot {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // bounds a broken release; no timing asserted
	for {
		st := pickersOf[*qll.State]("queued_least_latency")[pool]
		if st != nil {
			for _, r := range st.Snapshot().Replicas {
				if r.Addr == dial && r.InFlight == 0 && r.Dispatched > 0 {
					return r
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: replica %s never dispatched to, or its lease never released", pool, dial)
		}
		time.Sleep(time.Millisecond)
	}
}

// replicaServing starts a replica answering with h, closed when the
// test ends, and returns its dial address.
func replicaServing(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// statusOf sends req and returns the status of its answer, whose body it
// closes.
func statusOf(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func completion(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url+"/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func answer503(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "overloaded", http.StatusServiceUnavailable)
}

func answerOK(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"ok":true}`)) }

// A 5xx with no body (Content-Length: 0, or any answer to HEAD) is read
// to its end by the transport before reverse_proxy has the response, let
// alone its status: released there, it was a Success (with the fastest
// latency of the pool), never the replica's failure.
func TestBodylessFiveHundredIsAFailure(t *testing.T) {
	dial := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable) // no body: Content-Length: 0
	})
	for _, method := range []string{http.MethodPost, http.MethodHead} {
		t.Run(method, func(t *testing.T) {
			pool := freshPoolName("bodyless-5xx")
			url := startProxy(t, []map[string]any{qllProxy(pool, dial)}, nil)
			if status := statusOf(t, completion(t, method, url)); status != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want the replica's 503", status)
			}
			if r := qllReplica(t, pool, dial); r.Failures != 1 || r.Successes != 0 {
				t.Fatalf("the replica's bodyless 503: %d failures, %d successes (want 1, 0): %+v", r.Failures, r.Successes, r)
			}
		})
	}
}

// So is a 5xx whose body reverse_proxy buffers (response_buffers): it
// reads the body to its end before it sets the status placeholder.
func TestBufferedFiveHundredIsAFailure(t *testing.T) {
	dial := replicaServing(t, answer503)
	pool := freshPoolName("buffered-5xx")
	route := qllProxy(pool, dial)
	route["handle"].([]map[string]any)[0]["response_buffers"] = 1 << 20
	url := startProxy(t, []map[string]any{route}, nil)
	if status := statusOf(t, completion(t, http.MethodPost, url)); status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want the replica's 503", status)
	}
	if r := qllReplica(t, pool, dial); r.Failures != 1 || r.Successes != 0 {
		t.Fatalf("the replica's buffered 503: %d failures, %d successes (want 1, 0): %+v", r.Failures, r.Successes, r)
	}
}

// A replica that takes the request and drops the connection without an
// answer (a crash mid-request) is known to have failed only by the error
// the handler chain ended with ({http.error}); a handle_errors
// reverse_proxy through another pool's Sluice policy cleared it as its
// attempt began, and the crash read as the client leaving (Cancelled):
// the replica was never marked down.
func TestDroppedRequestIsAFailureWhenHandleErrorsProxiesThroughAnotherPool(t *testing.T) {
	dropDial := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	fbDial := replicaServing(t, answerOK)
	primary, second := freshPoolName("dropped-primary"), freshPoolName("dropped-fallback")
	url := startProxy(t, []map[string]any{qllProxy(primary, dropDial)}, []map[string]any{qllProxy(second, fbDial)})
	// No body: the dropped attempt sent it, nothing could send it again.
	req, err := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
	if err != nil {
		t.Fatal(err)
	}
	if status := statusOf(t, req); status != http.StatusOK {
		t.Fatalf("status %d, want the fallback's 200", status)
	}
	wantFallbackServed(t, second, fbDial)
	if r := qllReplica(t, primary, dropDial); r.Failures != 1 {
		t.Fatalf("the replica that dropped the request: %d failures (want 1): %+v", r.Failures, r)
	}
}

// handle_response may send a replica's 5xx on to another pool: the 5xx
// is the first replica's failure, though the second proxy's attempt
// cleared the status and upstream placeholders it was read from.
func TestFiveHundredHandedToAnotherPoolIsAFailure(t *testing.T) {
	failDial := replicaServing(t, answer503)
	fbDial := replicaServing(t, answerOK)
	primary, second := freshPoolName("handed-primary"), freshPoolName("handed-fallback")
	route := qllProxy(primary, failDial)
	route["handle"].([]map[string]any)[0]["handle_response"] = []map[string]any{{
		"match":  map[string]any{"status_code": []int{503}},
		"routes": []map[string]any{qllProxy(second, fbDial)},
	}}
	url := startProxy(t, []map[string]any{route}, nil)
	if status := statusOf(t, completion(t, http.MethodPost, url)); status != http.StatusOK {
		t.Fatalf("status %d, want the fallback's 200", status)
	}
	wantFallbackServed(t, second, fbDial)
	if r := qllReplica(t, primary, failDial); r.Failures != 1 {
		t.Fatalf("the replica that answered 503: %d failures (want 1): %+v", r.Failures, r)
	}
}

func wantFallbackServed(t *testing.T, pool, dial string) {
	t.Helper()
	if r := qllReplica(t, pool, dial); r.Successes != 1 {
		t.Fatalf("the fallback: %+v, want one success", r)
	}
}
