package caddymodule

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

// opaqueBody is a request body net/http cannot tell is in memory, as
// Caddy's own wrappers of the client's body are.
type opaqueBody struct{ io.Reader }

func (opaqueBody) Close() error { return nil }

// countingConn counts the writes the transport makes on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int32
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A body the policy read whole goes to the replica in one write with its
// headers. net/http writes the headers on their own first when it cannot
// tell the body is in memory: a second write (and packet, and read on the
// replica's side) per request, for bytes Sluice already holds. A policy
// that routes without the prompt (queued_least_latency,
// global_redis_least) reads a small body whole for that alone.
func TestABodyReadWholeGoesOutWithItsHeaders(t *testing.T) {
	const small = `{"prompt":"x","max_tokens":1}`
	large := `{"prompt":"` + strings.Repeat("x", smallBodyBytes) + `","max_tokens":1}`
	for _, tc := range []struct {
		name    string
		maxBody int64 // > 0: the policy reads the prompt
		body    string
		writes  int32 // 0: any
	}{
		{"prompt policy", DefaultMaxBodyBytes, small, 1},
		{"load-only policy, small body", 0, small, 1},
		{"load-only policy, large body streams", 0, large, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writes := sendThroughSelect(t, tc.maxBody, tc.body)
			if tc.writes > 0 && writes != tc.writes {
				t.Fatalf("the request went out in %d writes, want %d (headers and body together)", writes, tc.writes)
			}
		})
	}
}

// sendThroughSelect runs Select for a request with body, sends the
// request as reverse_proxy would to a replica that checks it got the body
// intact, and returns how many writes the transport made.
func sendThroughSelect(t *testing.T, maxBody int64, body string) int32 {
	t.Helper()
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- string(b)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	lease := &recordingLease{addr: addr}
	s := &selector{module: "test", pool: lb.GetPool("body-write-test"), varKey: "sluice.test.body-write",
		measure: measureAuto, maxBody: maxBody, log: zap.NewNop(),
		state: &policyState{picker: &panicPicker{lease: lease}}, readAhead: new(atomic.Bool)}
	s.readAhead.Store(true) // a config without a handle_errors proxy
	r, _, cancel := newRequest(t)
	r.Body, r.ContentLength = opaqueBody{strings.NewReader(body)}, int64(len(body))
	if up := s.Select(nil, r, httptest.NewRecorder()); up == nil || up.Dial != addr {
		t.Fatalf("Select: %v", up)
	}
	// What reverse_proxy does with the request Select saw.
	r.URL.Scheme, r.URL.Host, r.Host, r.RequestURI = "http", addr, addr, ""
	var writes atomic.Int32
	tr := &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, a)
		if err != nil {
			return nil, err
		}
		return countingConn{c, &writes}, nil
	}}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(r)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if b := <-got; b != body {
		t.Fatalf("the replica got %d bytes, want the %d sent", len(b), len(body))
	}
	cancel()
	if o := waitOutcomes(t, lease, 1); o[0].Kind != lb.Success {
		t.Fatalf("outcome %+v, want a success", o[0])
	}
	return writes.Load()
}
