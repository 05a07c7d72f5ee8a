package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// global_redis_least keeps passive health (per instance) and refuses a
// replica that failures marked down, yet health showed it down: false,
// failures: 0 (its view was its in-flight counts alone), where
// docs/api.md lists both for this policy.
func TestHealthShowsGlobalRedisLeastPassiveHealth(t *testing.T) {
	addr := redistest.Addr(t)
	cctx := provisionContext(t)
	pool := freshPoolName("health-grl-passive")
	bs, err := lb.ParseBackends([]string{"http://127.0.0.1:19431", "http://127.0.0.1:19432"})
	if err != nil {
		t.Fatal(err)
	}
	lb.GetPool(pool).Set(bs)
	p := &GlobalRedisLeast{Pool: pool, LeaseTTL: caddy.Duration(time.Hour),
		passiveHealth:   passiveHealth{FailDuration: caddy.Duration(time.Hour)},
		redisConnection: redisConnection{Redis: []string{addr}, KeyPrefix: fmt.Sprintf("health-grl-%d", time.Now().UnixNano())}}
	if err := p.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	ctx := context.Background()
	l, err := p.state.picker.Pick(ctx, &lb.Request{})
	if err != nil {
		t.Fatal(err)
	}
	down := l.Replica()
	l.Release(lb.Outcome{Kind: lb.Failure, Status: 502})
	if _, err := p.state.picker.Pick(ctx, &lb.Request{Unavailable: others(bs, down)}); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("a pick of %s after its failure: %v, want lb.ErrAllDown (down for an hour)", down, err)
	}

	rec := httptest.NewRecorder()
	serveHealth(rec, httptest.NewRequest(http.MethodGet, "/_custom_router/health", nil), pool)
	var body struct {
		Backends []struct {
			Addr     string `json:"addr"`
			Down     bool   `json:"down"`
			Failures uint64 `json:"failures"`
		} `json:"backends"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || len(body.Backends) != 2 {
		t.Fatalf("health %d %s (%v), want the 2 replicas", rec.Code, rec.Body, err)
	}
	for _, b := range body.Backends {
		wantDown, wantFailures := b.Addr == down, uint64(0)
		if wantDown {
			wantFailures = 1
		}
		if b.Down != wantDown || b.Failures != wantFailures {
			t.Errorf("%s: down %v failures %d, want down %v failures %d (%s)", b.Addr, b.Down, b.Failures, wantDown, wantFailures, rec.Body)
		}
	}
}

// others is the dials of bs other than addr.
func others(bs []lb.Backend, addr string) []string {
	var out []string
	for _, b := range bs {
		if b.Dial != addr {
			out = append(out, b.Dial)
		}
	}
	return out
}

// grlQueueHealth is the health report's global_queue, as a client reads it.
type grlQueueHealth struct {
	QueueDepth  int `json:"queue_depth"`
	GlobalQueue *struct {
		Length  *int64 `json:"length"`
		Waiting *int   `json:"waiting"`
		Error   string `json:"error"`
	} `json:"global_queue"`
}

func readGRLQueueHealth(t *testing.T, pool string) (grlQueueHealth, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	serveHealth(rec, httptest.NewRequest(http.MethodGet, "/_custom_router/health", nil), pool)
	var body grlQueueHealth
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("health %d %s (%v)", rec.Code, rec.Body, err)
	}
	return body, rec.Body.String()
}

// In queueing mode, health showed no queue at all: requests waiting in
// the pool's global queue (Redis) and this instance's among them are now
// global_queue's length (read from Redis when asked) and waiting.
func TestHealthShowsGlobalRedisLeastQueue(t *testing.T) {
	addr := redistest.Addr(t)
	cctx := provisionContext(t)
	pool := freshPoolName("health-grl-queue")
	bs, err := lb.ParseBackends([]string{"http://127.0.0.1:19441"})
	if err != nil {
		t.Fatal(err)
	}
	lb.GetPool(pool).Set(bs)
	p := &GlobalRedisLeast{Pool: pool, MaxInflight: 1, QueueTimeout: caddy.Duration(time.Minute), LeaseTTL: caddy.Duration(time.Hour),
		redisConnection: redisConnection{Redis: []string{addr}, KeyPrefix: fmt.Sprintf("health-grl-q-%d", time.Now().UnixNano())}}
	if err := p.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, err := p.state.picker.Pick(ctx, &lb.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(lb.Outcome{Kind: lb.Success})
	waited := make(chan error, 1)
	go func() {
		l, err := p.state.picker.Pick(ctx, &lb.Request{})
		if err == nil {
			l.Release(lb.Outcome{Kind: lb.Cancelled})
		}
		waited <- err
	}()
	// Wait until the second pick is queued: health shows it then.
	deadline := time.Now().Add(10 * time.Second)
	for {
		body, raw := readGRLQueueHealth(t, pool)
		if g := body.GlobalQueue; g != nil && g.Length != nil && *g.Length == 1 {
			if g.Waiting == nil || *g.Waiting != 1 || g.Error != "" || body.QueueDepth != 1 {
				t.Errorf("health %s: want global_queue length 1, waiting 1, no error, and queue_depth 1", raw)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health %s: want global_queue {length 1, waiting 1} while a pick waits", raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Errorf("the queued pick: %v, want context.Canceled", err)
	}
	// The cancelled pick leaves the queue in Redis before it returns, or,
	// when that call fails (a loaded box: its read timeout), by a release
	// sent later: health shows the queue empty once it has.
	deadline = time.Now().Add(10 * time.Second)
	for {
		body, raw := readGRLQueueHealth(t, pool)
		if g := body.GlobalQueue; g != nil && g.Length != nil && *g.Length == 0 && g.Waiting != nil && *g.Waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health %s: want global_queue length 0, waiting 0 once the waiter left", raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With Redis unreachable, global_queue says why instead of a length.
func TestHealthShowsGlobalRedisLeastQueueError(t *testing.T) {
	redistest.Addr(t) // same skip rules as the other Redis tests
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := l.Addr().String()
	l.Close() // nothing listens there now: connections are refused
	cctx := provisionContext(t)
	pool := freshPoolName("health-grl-queue-err")
	bs, err := lb.ParseBackends([]string{"http://127.0.0.1:19442"})
	if err != nil {
		t.Fatal(err)
	}
	lb.GetPool(pool).Set(bs)
	p := &GlobalRedisLeast{Pool: pool, MaxInflight: 1, QueueTimeout: caddy.Duration(time.Minute),
		redisConnection: redisConnection{Redis: []string{gone}}}
	if err := p.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	body, raw := readGRLQueueHealth(t, pool)
	if g := body.GlobalQueue; g == nil || g.Error == "" || g.Length != nil || g.Waiting == nil || *g.Waiting != 0 {
		t.Errorf("health %s: want global_queue with an error, no length, waiting 0", raw)
	}
}
