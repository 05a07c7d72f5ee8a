package caddymodule

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// proxyOnPool is a reverse_proxy handler with a Sluice policy on pool,
// its upstreams static (dials) or from src (a dynamic_upstreams object).
func proxyOnPool(pool string, src map[string]any, dials ...string) map[string]any {
	h := map[string]any{
		"handler": "reverse_proxy",
		"load_balancing": map[string]any{"selection_policy": map[string]any{
			"policy": "queued_least_latency", "pool": pool, "engine_metrics": "off", "state_log_interval": -1,
		}},
	}
	if src != nil {
		h["dynamic_upstreams"] = src
	}
	ups := make([]map[string]any, len(dials))
	for i, d := range dials {
		ups[i] = map[string]any{"dial": d}
	}
	if len(ups) > 0 {
		h["upstreams"] = ups
	}
	return h
}

// poolConfig is a config of one server on listen (admin off) with one
// route per handler, each a site of its own host name, the handler in a
// subroute as the Caddyfile writes it. No automatic HTTPS: the host
// names are made up.
func poolConfig(t *testing.T, listen string, handlers ...map[string]any) []byte {
	t.Helper()
	routes := make([]map[string]any, len(handlers))
	for i, h := range handlers {
		routes[i] = map[string]any{
			"match": []map[string]any{{"host": []string{fmt.Sprintf("site-%d.example", i+1)}}},
			"handle": []map[string]any{{"handler": "subroute", "routes": []map[string]any{{
				"handle": []map[string]any{h}}}}},
		}
	}
	b, err := json.Marshal(map[string]any{
		"admin": map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"sites": map[string]any{
			"listen": []string{listen}, "routes": routes, "automatic_https": map[string]any{"disable": true}}}}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// validate is `caddy validate` in process: the config is provisioned,
// never started.
func validate(t *testing.T, config []byte) error {
	t.Helper()
	var cfg caddy.Config
	if err := json.Unmarshal(config, &cfg); err != nil {
		t.Fatal(err)
	}
	return caddy.Validate(&cfg)
}

func TestPoolUpstreamsMustAgree(t *testing.T) {
	goldenTempDirs(t)
	set := func(pool string) map[string]any { return map[string]any{"source": "custom_router", "pool": pool} }
	cases := []struct {
		name    string
		proxies []map[string]any
		refused bool
		sources []string // what the refusal names besides the pool
	}{
		{"the same static upstreams, in any order",
			[]map[string]any{proxyOnPool("p", nil, "a:1", "b:1"), proxyOnPool("p", nil, "b:1", "a:1")}, false, nil},
		{"different static upstreams",
			[]map[string]any{proxyOnPool("p", nil, "a:1"), proxyOnPool("p", nil, "b:1")}, true,
			[]string{"upstreams a:1", "upstreams b:1"}},
		{"different static upstreams on different pools",
			[]map[string]any{proxyOnPool("p", nil, "a:1"), proxyOnPool("q", nil, "b:1")}, false, nil},
		{"the pool's backend set twice", []map[string]any{proxyOnPool("p", set("p")), proxyOnPool("p", set("p"))}, false, nil},
		{"the backend set and static upstreams",
			[]map[string]any{proxyOnPool("p", set("p")), proxyOnPool("p", nil, "a:1")}, true,
			[]string{"dynamic custom_router p", "upstreams a:1"}},
		{"two pools' backend sets", []map[string]any{proxyOnPool("p", set("p")), proxyOnPool("p", set("q"))}, true,
			[]string{"dynamic custom_router p", "dynamic custom_router q"}},
		{"another dynamic source",
			[]map[string]any{proxyOnPool("p", map[string]any{"source": "a", "name": "x", "port": "1"}), proxyOnPool("p", nil, "a:1")}, true,
			[]string{"dynamic http.reverse_proxy.upstreams.a", "upstreams a:1"}},
		{"one handler alone", []map[string]any{proxyOnPool("p", map[string]any{"source": "a", "name": "x", "port": "1"})}, false, nil},
	}
	for _, tc := range cases {
		err := validate(t, poolConfig(t, "127.0.0.1:0", tc.proxies...))
		if (err != nil) != tc.refused {
			t.Errorf("%s: %v, want refused %t", tc.name, err, tc.refused)
			continue
		}
		if err == nil {
			continue
		}
		if !strings.Contains(err.Error(), `pool "p"`) {
			t.Errorf("%s: %v does not name the pool", tc.name, err)
		}
		for _, src := range tc.sources {
			if !strings.Contains(err.Error(), src) {
				t.Errorf("%s: %v does not name the source %s", tc.name, err, src)
			}
		}
	}
}

// The refusal reads the same whichever handler Caddy provisions first
// (servers are provisioned in map order): the two sources sorted.
func TestPoolUpstreamsRefusalIsStable(t *testing.T) {
	goldenTempDirs(t)
	var first string
	for i, proxies := range [][]map[string]any{
		{proxyOnPool("p", nil, "a:1"), proxyOnPool("p", nil, "b:1")},
		{proxyOnPool("p", nil, "b:1"), proxyOnPool("p", nil, "a:1")},
	} {
		err := validate(t, poolConfig(t, "127.0.0.1:0", proxies...))
		if err == nil {
			t.Fatalf("order %d: a pool conflict was accepted", i)
		}
		msg := err.Error()
		msg = msg[strings.Index(msg, `pool "p"`):]
		if first == "" {
			first = msg
		} else if msg != first {
			t.Fatalf("the refusal depends on the order of the handlers:\n%s\n%s", first, msg)
		}
	}
	if !strings.Contains(first, "upstreams a:1") || !strings.Contains(first, "upstreams b:1") {
		t.Fatalf("%s does not name both upstream lists", first)
	}
}
