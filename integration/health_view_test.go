package integration

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// TestQueuedRequestSeesAReplicaComeBack: with one replica busy and the
// other down by Caddy's active health check, a request waits in
// queued_least_latency. When the health check passes again the request
// must go there, not wait for the busy replica (before, the waiting
// request kept the view its own arrival brought, and went to the busy
// replica once it was done).
func TestQueuedRequestSeesAReplicaComeBack(t *testing.T) {
	release := make(chan struct{})
	var healthy atomic.Bool
	replica := func(name string, serve http.HandlerFunc) {
		srv := &http.Server{Addr: "127.0.0.1:" + name, Handler: serve}
		go srv.ListenAndServe()
		t.Cleanup(func() { srv.Close() })
	}
	replica("9367", func(w http.ResponseWriter, r *http.Request) { // busy: holds its request
		if r.URL.Path == "/health" {
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "9367")
	})
	replica("9368", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "9368")
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	startCaddy(t, globals+`
:9369 {
	reverse_proxy 127.0.0.1:9367 127.0.0.1:9368 {
		lb_policy queued_least_latency {
			pool health-view
			parallelism 1
		}
		health_uri /health
		health_interval 100ms
		health_fails 1
		health_passes 1
	}
}
`)
	get := func() (string, error) {
		resp, err := http.Get("http://127.0.0.1:9369/v1/completions")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), err
	}
	time.Sleep(500 * time.Millisecond) // a few health checks: 9368 is down
	busy := make(chan string, 1)
	go func() { s, _ := get(); busy <- s }()
	time.Sleep(300 * time.Millisecond) // the busy request holds 9367
	waiter := make(chan string, 1)
	go func() { s, _ := get(); waiter <- s }()
	time.Sleep(300 * time.Millisecond) // the second request waits
	healthy.Store(true)

	select {
	case got := <-waiter:
		if got != "200 9368" {
			t.Fatalf("the waiting request answered %q, want 200 from 9368, back from its health check", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting request was not sent to 9368 when its health check passed again")
	}
	close(release)
	if got := <-busy; got != "200 9367" {
		t.Fatalf("the busy request answered %q", got)
	}
}
