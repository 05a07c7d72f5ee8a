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
// replica's side) per request, for bytes Sluice already holds.
func TestABodyReadWholeGoesOutWithItsHeaders(t *testing.T) {
	const body = `{"prompt":"x","max_tokens":1}`
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- string(b)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	lease := &recordingLease{addr: addr}
	s := &selector{module: "test", pool: lb.GetPool("body-write-test"), varKey: "sluice.test.body-write",
		measure: measureAuto, maxBody: DefaultMaxBodyBytes, log: zap.NewNop(),
		state: &policyState{picker: &panicPicker{lease: lease}}}
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
		t.Fatalf("the replica got %q, want %q", b, body)
	}
	if n := writes.Load(); n != 1 {
		t.Fatalf("the request went out in %d writes, want 1 (headers and body together)", n)
	}
	cancel()
	if o := waitOutcomes(t, lease, 1); o[0].Kind != lb.Success {
		t.Fatalf("outcome %+v, want a success", o[0])
	}
}
