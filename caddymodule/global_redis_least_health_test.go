package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
