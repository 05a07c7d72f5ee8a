package caddymodule

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// A name with two addresses (localhost: ::1, then 127.0.0.1, for a
// replica that listens on IPv4 only) is dialled one address after the
// other, and the trace hears each address's ConnectDone: the first one's
// error, then the connection that carries the request. The replica's
// answer on that connection is this attempt's Success; the dial error of
// the address that refused is nobody's failure.
func TestAttemptAnsweredAfterAnotherAddressRefusedIsASuccess(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	dial := strings.TrimPrefix(srv.URL, "http://")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := ln.Addr().String()
	ln.Close()

	// What net.Dialer does for a name with two addresses, the first
	// refusing: each address is dialled with the request's context, whose
	// trace hears each one's ConnectDone.
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		if c, err := d.DialContext(ctx, network, refusing); err == nil {
			c.Close()
			t.Fatalf("%s did not refuse", refusing)
		}
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()

	r, repl, cancel := requestTo(t, srv.URL)
	a := attemptFor(r, "test", measureLastByte)
	l := &recordingLease{addr: dial}
	if !a.begin(l, r, firstByteRule{}) {
		t.Fatal("begin refused a live request")
	}
	resp, err := tr.RoundTrip(r)
	if err != nil {
		t.Fatal(err)
	}
	repl.Set(keyHostport, dial)
	repl.Set(keyStatus, resp.StatusCode)
	io.ReadAll(resp.Body)
	resp.Body.Close()
	cancel()
	if got := waitOutcomes(t, l, 1)[0]; got.Kind != lb.Success {
		t.Fatalf("outcome %+v, want the replica's answer a Success", got)
	}
}

// A replica whose TLS handshake fails (here: it speaks plain HTTP to a
// TLS transport) is the attempt's failure through reverse_proxy itself:
// its 502 leaves the error in {http.error}, which the attempt reads at
// the request's end. The trace needs no TLS hook of its own for it.
func TestTLSHandshakeFailureIsAFailure(t *testing.T) {
	dial := replicaServing(t, answerOK)
	pool := freshPoolName("tls-handshake")
	route := qllProxy(pool, dial)
	route["handle"].([]map[string]any)[0]["transport"] = map[string]any{
		"protocol": "http", "tls": map[string]any{"insecure_skip_verify": true},
	}
	url := startProxy(t, []map[string]any{route}, nil)
	if status := statusOf(t, completion(t, http.MethodPost, url)); status != http.StatusBadGateway {
		t.Fatalf("status %d, want 502 for the failed handshake", status)
	}
	if r := qllReplica(t, pool, dial); r.Failures != 1 || r.Successes != 0 {
		t.Fatalf("the replica whose handshake failed: %d failures, %d successes (want 1, 0): %+v", r.Failures, r.Successes, r)
	}
}
