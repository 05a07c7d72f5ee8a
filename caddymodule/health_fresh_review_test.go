package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// healthBody is the health answer as a client decodes it.
type healthBody struct {
	Managed  bool `json:"backends_set"`
	Backends []struct {
		Addr     string          `json:"addr"`
		URL      string          `json:"url"`
		InFlight int             `json:"in_flight"`
		Draining bool            `json:"draining"`
		Metrics  json.RawMessage `json:"metrics"`
	} `json:"backends"`
}

func getHealth(t *testing.T, pool string) (healthBody, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	serveHealth(rec, httptest.NewRequest(http.MethodGet, "/_custom_router/health", nil), pool)
	var body healthBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("health %d %s (%v)", rec.Code, rec.Body, err)
	}
	return body, rec.Body.String()
}

// healthPolicy is a selection policy provisioned on a pool, for the
// health tests that run every policy alike.
type healthPolicy interface {
	caddy.Provisioner
	caddy.CleanerUpper
}

func healthPolicies(t *testing.T) map[string]func(pool string) (healthPolicy, func() *policyState) {
	mods := map[string]func(pool string) (healthPolicy, func() *policyState){
		"queued_least_latency": func(pool string) (healthPolicy, func() *policyState) {
			p := &QueuedLeastLatency{Pool: pool}
			return p, func() *policyState { return p.state }
		},
		"load_aware": func(pool string) (healthPolicy, func() *policyState) {
			p := &LoadAware{Pool: pool}
			return p, func() *policyState { return p.state }
		},
		"cache_aware": func(pool string) (healthPolicy, func() *policyState) {
			p := &CacheAware{Pool: pool}
			return p, func() *policyState { return p.state }
		},
	}
	if addr := redistest.Addr(t); addr != "" {
		mods["global_redis_least"] = func(pool string) (healthPolicy, func() *policyState) {
			p := &GlobalRedisLeast{Pool: pool, LeaseTTL: caddy.Duration(time.Hour),
				redisConnection: redisConnection{Redis: []string{addr}, KeyPrefix: fmt.Sprintf("health-fresh-%d", time.Now().UnixNano())}}
			return p, func() *policyState { return p.state }
		}
	}
	return mods
}

// A pool without a managed set (backends_set false: the policies pick
// among reverse_proxy's static upstreams) shows those upstreams, in
// their order, with what the policy knows of each. Before, its health
// listed no backend at all — however many replicas the policy served,
// with requests in flight, down or not — so the one pool an operator
// could not post a set to was the one whose replicas health hid.
func TestHealthOfAPoolOnStaticUpstreamsShowsThem(t *testing.T) {
	cctx := provisionContext(t)
	for module, build := range healthPolicies(t) {
		t.Run(module, func(t *testing.T) {
			name := freshPoolName("health-static-" + module)
			m, state := build(name)
			if err := m.Provision(cctx); err != nil {
				t.Fatal(err)
			}
			defer m.Cleanup()
			const a, b = "127.0.0.1:19411", "127.0.0.1:19412"
			state().syncStatic(reverseproxy.UpstreamPool{{Dial: b, Host: new(reverseproxy.Host)}, {Dial: a, Host: new(reverseproxy.Host)}}, upstreamScheme{})
			l, err := state().picker.Pick(context.Background(), &lb.Request{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(lb.Outcome{Kind: lb.Success})

			body, raw := getHealth(t, name)
			if body.Managed || len(body.Backends) != 2 || body.Backends[0].Addr != b || body.Backends[1].Addr != a {
				t.Fatalf("health = %s\nwant backends_set false and the static upstreams %s, %s in their order", raw, b, a)
			}
			for _, bh := range body.Backends {
				want := 0
				if bh.Addr == l.Replica() {
					want = 1
				}
				if bh.InFlight != want || bh.Draining || bh.URL != "http://"+bh.Addr {
					t.Errorf("%s: in_flight %d draining %v url %q, want in_flight %d, not draining, url http://%s (%s)",
						bh.Addr, bh.InFlight, bh.Draining, bh.URL, want, bh.Addr, raw)
				}
			}
		})
	}
}

// flow_control on a pool without a managed set watches the static
// upstreams of the reverse_proxy after it; with the utilization detector
// it scrapes their metrics, which decide whether its gate opens. Health
// shows them, with the metrics, as it does for a managed set.
func TestHealthOfFlowControlOnStaticUpstreamsShowsTheirMetrics(t *testing.T) {
	cctx := provisionContext(t)
	name := freshPoolName("health-static-flow")
	fc := &FlowControl{Pool: name, Detector: "utilization"}
	if err := fc.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer fc.Cleanup()
	const a = "127.0.0.1:19413"
	fc.state.setFixed(0, staticBackends(reverseproxy.UpstreamPool{{Dial: a}}, upstreamScheme{}))

	body, raw := getHealth(t, name)
	if body.Managed || len(body.Backends) != 1 || body.Backends[0].Addr != a || len(body.Backends[0].Metrics) == 0 {
		t.Fatalf("health = %s\nwant the static upstream %s with its scraped metrics", raw, a)
	}
}

// A replica removed from the set while requests to it still run is
// listed after the set, draining: true, whichever policy's view health
// shows (docs/api.md). global_redis_least's view, its in-flight counts,
// marks none draining, and health dropped such a replica: its requests
// vanished from the answer until they ended.
func TestHealthListsADrainingReplicaOfAnInFlightOnlyView(t *testing.T) {
	cctx := provisionContext(t)
	for module, build := range healthPolicies(t) {
		t.Run(module, func(t *testing.T) {
			name := freshPoolName("health-draining-" + module)
			bs, err := lb.ParseBackends([]string{"http://127.0.0.1:19421", "http://127.0.0.1:19422"})
			if err != nil {
				t.Fatal(err)
			}
			lb.GetPool(name).Set(bs)
			m, state := build(name)
			if err := m.Provision(cctx); err != nil {
				t.Fatal(err)
			}
			defer m.Cleanup()
			l, err := state().picker.Pick(context.Background(), &lb.Request{})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(lb.Outcome{Kind: lb.Success})
			var stays lb.Backend
			for _, b := range bs {
				if b.Dial != l.Replica() {
					stays = b
				}
			}
			lb.GetPool(name).Set([]lb.Backend{stays})

			body, raw := getHealth(t, name)
			if len(body.Backends) != 2 || body.Backends[0].Addr != stays.Dial || body.Backends[0].Draining ||
				body.Backends[1].Addr != l.Replica() || !body.Backends[1].Draining || body.Backends[1].InFlight != 1 {
				t.Fatalf("health = %s\nwant %s, then %s draining with in_flight 1", raw, stays.Dial, l.Replica())
			}
		})
	}
}
