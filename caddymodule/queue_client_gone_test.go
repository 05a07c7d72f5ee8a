package caddymodule

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/qll"
	"github.com/sluice-router/sluice/lb/redisleast"
	"github.com/sluice-router/sluice/lb/redistest"
)

// An HTTP/1.1 client that gives up while its request waits in
// queued_least_latency's queue must leave the queue at once. net/http
// notices a closed connection only once the handler has read the request
// body, and a body over the 16 KiB every policy reads ahead (a long
// prompt, an upload) stayed unread while it waited: the request kept its
// place until its queue_timeout (20 minutes by default), counted against
// queue_max_size, and was then sent to a replica for nobody.
func TestQueuedClientThatLeavesLeavesQLLsQueue(t *testing.T) {
	p := &QueuedLeastLatency{Pool: freshPoolName("qll-gone"), Parallelism: 1}
	if err := p.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	st := p.state.picker.(*qll.State)
	pool := reverseproxy.UpstreamPool{{Dial: "127.0.0.1:19", Host: new(reverseproxy.Host)}}
	srv := selectServer(t, p, pool)
	p.state.syncStatic(pool, p.scheme)
	held, err := st.Acquire(context.Background()) // the replica's one slot
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(lb.Outcome{Kind: lb.Success})

	conn := postHTTP1(t, srv, len(longPrompt), longPrompt)
	waitFor(t, "the request queued", func() bool { return st.Snapshot().QueueDepth == 1 })
	conn.Close()
	waitFor(t, "the request of the client that left to leave the queue", func() bool { return st.Snapshot().QueueDepth == 0 })
	if c := st.Snapshot().Counters; c.Cancelled != 1 {
		t.Fatalf("counters %+v: want the queued request cancelled", c)
	}
}

// The same for global_redis_least's global queue (queueing mode).
func TestQueuedClientThatLeavesLeavesTheGlobalQueue(t *testing.T) {
	p := &GlobalRedisLeast{Pool: freshPoolName("grl-gone"), MaxInflight: 1, QueueTimeout: caddy.Duration(time.Hour),
		redisConnection: redisConnection{Redis: []string{redistest.Addr(t)}, KeyPrefix: fmt.Sprintf("grl-gone-%d", time.Now().UnixNano())}}
	if err := p.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	st := p.state.picker.(*redisleast.Store)
	pool := reverseproxy.UpstreamPool{{Dial: "127.0.0.1:19", Host: new(reverseproxy.Host)}}
	srv := selectServer(t, p, pool)
	p.state.syncStatic(pool, p.scheme)
	held, err := st.Pick(context.Background(), &lb.Request{}) // the replica's one slot
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(lb.Outcome{Kind: lb.Success})

	conn := postHTTP1(t, srv, len(longPrompt), longPrompt)
	waitFor(t, "the request queued", func() bool { return st.Stats().Waiting == 1 })
	conn.Close()
	waitFor(t, "the request of the client that left to leave the queue", func() bool { return st.Stats().Waiting == 0 })
}

// postHTTP1 opens an HTTP/1.1 connection to srv and writes a completion
// request declaring declared body bytes and sending body (all of it, or a
// part); the caller closes the connection to leave.
func postHTTP1(t *testing.T, srv *httptest.Server, declared int, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", declared, body)
	return conn
}

// selectServer serves p's Select over pool, as reverse_proxy calls it.
func selectServer(t *testing.T, p reverseproxy.Selector, pool reverseproxy.UpstreamPool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repl := caddy.NewReplacer()
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
		p.Select(pool, r, w)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// longPrompt is a completion body over the 16 KiB every policy reads ahead.
var longPrompt = fmt.Sprintf(`{"model":"m","prompt":%q}`, strings.Repeat("a long prompt ", 5000))
