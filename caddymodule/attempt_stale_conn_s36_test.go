package caddymodule

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// staleConn is a keep-alive connection the replica has dropped: once
// stale, a write fails before a byte leaves, as a write to a reset socket
// does.
type staleConn struct {
	net.Conn
	stale *atomic.Bool
}

func (c *staleConn) Write(p []byte) (int, error) {
	if c.stale.Load() {
		return 0, errors.New("write: connection reset by peer")
	}
	return c.Conn.Write(p)
}

// An engine's server drops idle keep-alive connections (uvicorn after 5 s,
// vLLM's and SGLang's default). A request that finds its pooled connection
// dropped fails its write with nothing sent; Go's transport sends it again
// on a new connection, and the replica answers. That answer is the
// attempt's Success: the write error on the dropped connection was
// nobody's failure (before, it made the trace ignore the answer, and a
// healthy replica was charged a failure).
func TestAttemptAnsweredAfterAStaleConnectionIsASuccess(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	dial := strings.TrimPrefix(srv.URL, "http://")

	var dials atomic.Int32
	var firstStale atomic.Bool
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if dials.Add(1) == 1 {
			return &staleConn{Conn: c, stale: &firstStale}, nil
		}
		return c, nil
	}}
	defer tr.CloseIdleConnections()

	// A first request leaves its connection in the pool.
	warm, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(warm)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	firstStale.Store(true)

	r, repl, cancel := requestTo(t, srv.URL)
	body := `{"prompt":"x"}`
	r.Body = io.NopCloser(strings.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	a := attemptFor(r, "test", measureLastByte)
	l := &recordingLease{addr: dial}
	if !a.begin(l, r, firstByteRule{}) {
		t.Fatal("begin refused a live request")
	}
	resp, err = tr.RoundTrip(r)
	if err != nil {
		t.Fatalf("the transport did not send the request again on a new connection: %v", err)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2 (the stale connection, then a new one)", n)
	}
	repl.Set(keyHostport, dial)
	repl.Set(keyStatus, resp.StatusCode)
	io.ReadAll(resp.Body)
	resp.Body.Close()
	cancel()
	if got := waitOutcomes(t, l, 1)[0]; got.Kind != lb.Success || got.Latency <= 0 {
		t.Fatalf("outcome %+v, want a Success (the replica answered on the new connection)", got)
	}
}
