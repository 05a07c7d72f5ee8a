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

// A small body goes to the replica in one write with its headers, whether
// the policy reads the prompt (the body is read whole for it) or not (a
// body of known length up to smallBodyBytes is read whole anyway).
// net/http writes the headers on their own first when it cannot tell the
// body is in memory: a second write (and packet, and read on the
// replica's side) per request. A larger body a policy does not read is
// left to stream.
func TestASmallBodyGoesOutWithItsHeaders(t *testing.T) {
	small := `{"prompt":"x","max_tokens":1}`
	large := `{"prompt":"` + strings.Repeat("x", smallBodyBytes) + `"}`
	for _, c := range []struct {
		name    string
		maxBody int64
		body    string
		writes  int32
	}{
		{"policy reads the prompt", DefaultMaxBodyBytes, small, 1},
		{"policy does not read the prompt", 0, small, 1},
		{"large body, policy does not read the prompt", 0, large, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if n := sendThroughSelect(t, c.maxBody, c.body); n != c.writes {
				t.Fatalf("the request went out in %d writes, want %d", n, c.writes)
			}
		})
	}
}

// sendThroughSelect picks with a selector reading up to maxBody of the
// prompt, sends the request Select prepared to a replica as reverse_proxy
// would, checks the replica got body unchanged and the attempt ended a
// success, and returns the writes the request took.
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
		t.Fatalf("the replica got %d bytes %.40q, want %d bytes %.40q", len(b), b, len(body), body)
	}
	cancel()
	if o := waitOutcomes(t, lease, 1); o[0].Kind != lb.Success {
		t.Fatalf("outcome %+v, want a success", o[0])
	}
	return writes.Load()
}
