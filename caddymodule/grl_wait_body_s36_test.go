package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redisleast"
	"github.com/sluice-router/sluice/lb/redistest"
)

// global_redis_least reads a waiting pick's body too (queue_wait_body.go):
// a pick whose queue_timeout ends while its client's upload is stalled for
// good must be answered 503 then, and leave nothing behind in Redis.
func TestGRLTimedOutPickAnswersWhileItsUploadStalls(t *testing.T) {
	conn := redisConnection{Redis: []string{redistest.Addr(t)}, KeyPrefix: fmt.Sprintf("grl-s36-stall-%d", time.Now().UnixNano())}
	p := &GlobalRedisLeast{Pool: freshPoolName("grl-s36-stall"), MaxInflight: 1,
		QueueTimeout: caddy.Duration(50 * time.Millisecond), redisConnection: conn}
	if err := p.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Cleanup() })
	st := p.state.picker.(*redisleast.Store)
	pool := reverseproxy.UpstreamPool{{Dial: "127.0.0.1:19", Host: new(reverseproxy.Host)}}
	srv := selectServer(t, p, pool)
	p.state.syncStatic(pool, p.scheme)
	held, err := st.Pick(context.Background(), &lb.Request{}) // the replica's one slot
	if err != nil {
		t.Fatal(err)
	}

	c := stalledPost(t, srv, "", len(longPrompt), longPrompt[:20<<10])
	resp := answerWhileStalled(t, c, "timed-out pick")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("timed-out pick: %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	// Nothing of the refused request is left: its slot (it may have been
	// handed the held one's), its place in the queue, its waiter record.
	held.Release(lb.Outcome{Kind: lb.Success})
	rc := redistest.Client(t, redisconn.Config{Addrs: conn.Redis})
	tag := redisconn.KeyTag(conn.KeyPrefix, poolName(p.Pool))
	waitFor(t, "the Redis counts back to zero and the queue empty", func() bool {
		counts, err := st.Counts(context.Background())
		return err == nil && counts["127.0.0.1:19"] == 0 && st.Stats().Waiting == 0 &&
			redisLen(t, rc, "LLEN", tag+":queue") == 0 && redisLen(t, rc, "HLEN", tag+":waiters") == 0 &&
			redisLen(t, rc, "HLEN", tag+":assigned") == 0
	})
}

// redisLen is LLEN or HLEN of key.
func redisLen(t *testing.T, c rueidis.Client, cmd, key string) int64 {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Arbitrary(cmd).Keys(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
