package caddymodule

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/qll"
)

// queued_least_latency reads a waiting pick's body too (queue_wait_body.go):
// a pick whose queue_timeout ends while its client's upload is stalled.
func TestQLLTimedOutPickAnswersWhileItsUploadStalls(t *testing.T) {
	p := &QueuedLeastLatency{Pool: freshPoolName("qll-s35-stall"), Parallelism: 1, QueueTimeout: caddy.Duration(50 * time.Millisecond)}
	if err := p.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Cleanup() })
	st := p.state.picker.(*qll.State)
	pool := reverseproxy.UpstreamPool{{Dial: "127.0.0.1:19", Host: new(reverseproxy.Host)}}
	srv := selectServer(t, p, pool)
	p.state.syncStatic(pool, p.scheme)
	held, err := st.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(lb.Outcome{Kind: lb.Success})

	conn := stalledPost(t, srv, "", len(longPrompt), longPrompt[:20<<10])
	resp := answerWhileStalled(t, conn, "timed-out pick")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("timed-out pick: %d, want 503", resp.StatusCode)
	}
}
