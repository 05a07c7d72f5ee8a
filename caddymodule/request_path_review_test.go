package caddymodule

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/qll"
)

// qllProxyRetrying is qllProxy with lb_retries and a retry_match.
func qllProxyRetrying(pool string, retries int, retryMatch []map[string]any, upstreams ...string) map[string]any {
	route := qllProxy(pool, upstreams...)
	lbCfg := route["handle"].([]map[string]any)[0]["load_balancing"].(map[string]any)
	lbCfg["retries"] = retries
	if retryMatch != nil {
		lbCfg["retry_match"] = retryMatch
	}
	return route
}

// Caddy 2.11's retry_match on the response ({rp.status_code}) retries a
// request whose replica answered: the retry must go to another replica,
// as the matched answer says (a replica's 429), not back to the same one.
func TestResponseRetryGoesToAnotherReplica(t *testing.T) {
	var busyHits, okHits atomic.Int32
	busy := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		busyHits.Add(1)
		http.Error(w, "busy", http.StatusTooManyRequests)
	})
	ok := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		okHits.Add(1)
		answerOK(w, r)
	})
	pool := freshPoolName("response-retry")
	match := []map[string]any{{"expression": "{http.reverse_proxy.status_code} == 429"}}
	url := startProxy(t, []map[string]any{qllProxyRetrying(pool, 1, match, busy, ok)}, nil)
	for i := 0; i < 4; i++ {
		req, err := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
		if err != nil {
			t.Fatal(err)
		}
		if status := statusOf(t, req); status != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200 from the other replica (busy hit %d times, ok %d)", i, status, busyHits.Load(), okHits.Load())
		}
	}
	if r := qllReplica(t, pool, busy); r.Failures != 0 {
		t.Fatalf("the replica that answered 429: %+v, want no failure (it answered)", r)
	}
	// With no other replica, the retry goes to the same one.
	busyHits.Store(0)
	alone := freshPoolName("response-retry-alone")
	url = startProxy(t, []map[string]any{qllProxyRetrying(alone, 1, match, busy)}, nil)
	req, err := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
	if err != nil {
		t.Fatal(err)
	}
	if status := statusOf(t, req); status != http.StatusTooManyRequests || busyHits.Load() != 2 {
		t.Fatalf("alone: status %d after %d attempts, want its 429 after 2", status, busyHits.Load())
	}
}

// waitUntil polls cond (bounded by a generous deadline that only stops a
// broken test; no timing is asserted).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// An attempt abandoned at its first-byte limit is the replica's failure,
// reverse_proxy retries it (a GET) elsewhere, and nothing of it is kept:
// its lease is released once, it leaves the first-byte watch.
func TestFirstByteTimeoutRetriedElsewhere(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	hung := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	ok := replicaServing(t, answerOK)
	pool := freshPoolName("first-byte-retry")
	route := qllProxyRetrying(pool, 1, nil, hung, ok)
	route["handle"].([]map[string]any)[0]["load_balancing"].(map[string]any)["selection_policy"].(map[string]any)["first_byte_timeout"] = int64(200 * time.Millisecond)
	url := startProxy(t, []map[string]any{route}, nil)
	for i := 0; i < 3; i++ {
		req, err := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
		if err != nil {
			t.Fatal(err)
		}
		if status := statusOf(t, req); status != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200 from the replica that answers", i, status)
		}
	}
	r := qllReplica(t, pool, hung)
	if r.Failures == 0 || r.Successes != 0 {
		t.Fatalf("the hung replica: %+v, want failures only", r)
	}
	waitUntil(t, "the first-byte watch empties", func() bool { return firstByteWatched.len() == 0 })
}

// upgradeEcho is a replica that switches protocols (a websocket's 101)
// and echoes what it reads until its client closes.
func upgradeEcho(w http.ResponseWriter, r *http.Request) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	brw.Flush()
	io.Copy(conn, brw)
}

// A websocket (101) holds its replica while it is open and is released
// once, for no failure, when its client closes it.
func TestUpgradedConnectionIsReleasedWhenItCloses(t *testing.T) {
	dial := replicaServing(t, upgradeEcho)
	pool := freshPoolName("upgrade")
	url := startProxy(t, []map[string]any{qllProxy(pool, dial)}, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d, want 101", resp.StatusCode)
	}
	conn.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q %v", buf, err)
	}
	st := pickersOf[*qll.State]("queued_least_latency")[pool]
	if in := st.Snapshot().Replicas[0].InFlight; in != 1 {
		t.Fatalf("while the connection is open the replica has %d in flight, want 1", in)
	}
	conn.Close()
	if r := qllReplica(t, pool, dial); r.Failures != 0 {
		t.Fatalf("the upgraded connection's replica: %+v, want no failure", r)
	}
	waitUntil(t, "the first-byte watch empties", func() bool { return firstByteWatched.len() == 0 })
}

// A client that uploads its body slowly (a long audio file over a slow
// link, or a client trickling bytes on purpose) holds the attempt in its
// own upload: the first-byte limit counts the replica's time, not the
// client's. Counted from the pick, a replica that answered at once once
// it had the body got 504 and a failure (max_fails 1: marked down), so
// any client could knock replicas out by uploading slowly.
func TestSlowUploadIsNotTheReplicasFirstByteTimeout(t *testing.T) {
	dial := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		answerOK(w, r)
	})
	pool := freshPoolName("slow-upload")
	route := qllProxy(pool, dial)
	route["handle"].([]map[string]any)[0]["load_balancing"].(map[string]any)["selection_policy"].(map[string]any)["first_byte_timeout"] = int64(200 * time.Millisecond)
	url := startProxy(t, []map[string]any{route}, nil)
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(`{"prompt":"`))
		for i := 0; i < 6; i++ { // the client's upload outlasts the limit
			time.Sleep(100 * time.Millisecond)
			pw.Write([]byte("hello "))
		}
		pw.Write([]byte(`"}`))
		pw.Close()
	}()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", pr) // chunked: streamed, not read ahead
	if err != nil {
		t.Fatal(err)
	}
	if status := statusOf(t, req); status != http.StatusOK {
		t.Fatalf("status %d, want the replica's 200 (it answered as soon as it had the body)", status)
	}
	if r := qllReplica(t, pool, dial); r.Failures != 0 || r.Successes != 1 {
		t.Fatalf("the replica: %d failures, %d successes, want 0, 1: the slow upload was the client's", r.Failures, r.Successes)
	}
}

// The upload's time is the client's, but a replica that takes the whole
// streamed body and sends nothing is still abandoned at its limit.
func TestReplicaSilentAfterAStreamedUploadTimesOut(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	dial := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	pool := freshPoolName("silent-after-upload")
	route := qllProxy(pool, dial)
	route["handle"].([]map[string]any)[0]["load_balancing"].(map[string]any)["selection_policy"].(map[string]any)["first_byte_timeout"] = int64(200 * time.Millisecond)
	url := startProxy(t, []map[string]any{route}, nil)
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(`{"prompt":"hello"}`))
		pw.Close()
	}()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", pr)
	if err != nil {
		t.Fatal(err)
	}
	if status := statusOf(t, req); status != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504 from the first-byte limit", status)
	}
	if r := qllReplica(t, pool, dial); r.Failures != 1 {
		t.Fatalf("the silent replica: %+v, want one failure", r)
	}
	waitUntil(t, "the first-byte watch empties", func() bool { return firstByteWatched.len() == 0 })
}
