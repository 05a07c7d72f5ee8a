package caddymodule

import (
	"slices"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

// poolReloadConfig is a Caddy config whose reverse_proxy takes its
// upstreams from pool's backend set (dynamic custom_router) and picks with
// queued_least_latency on the same pool; with refuse, Caddy refuses it
// after it provisioned the proxy (refusedAfter).
func poolReloadConfig(t *testing.T, pool string, refuse bool) []byte {
	t.Helper()
	handlers := []map[string]any{{
		"handler":           "reverse_proxy",
		"dynamic_upstreams": map[string]any{"source": "custom_router", "pool": pool},
		"load_balancing":    map[string]any{"selection_policy": map[string]any{"policy": "queued_least_latency", "pool": pool}},
	}}
	if refuse {
		handlers = refusedAfter(handlers, pool)
	}
	return oneRouteConfig(t, handlers)
}

// A refused reload changes nothing that runs, the pools Sluice lists
// included: a config Caddy refused after provisioning a proxy on a new
// pool left that pool listed by /sluice/pools, its persisted backend set
// restored into it, while no running config used it. The set is restored
// when a config using the pool starts.
func TestRefusedReloadNeitherListsNorRestoresItsPool(t *testing.T) {
	goldenTempDirs(t)
	usePoolsDir(t)
	running, refused := freshPoolName("reload-running"), freshPoolName("reload-refused")
	saved, err := lb.ParseBackends([]string{"http://127.0.0.1:9", "http://127.0.0.1:10"})
	if err != nil {
		t.Fatal(err)
	}
	persistPool(refused, saved, zap.NewNop())

	if err := caddy.Load(poolReloadConfig(t, running, false), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	if !slices.Contains(listedPools(), running) {
		t.Fatalf("the running config's pool %q is not listed: %v", running, listedPools())
	}

	if err := caddy.Load(poolReloadConfig(t, refused, true), true); err == nil {
		t.Fatal("Caddy loaded a config with concurrency -1")
	}
	if got := listedPools(); slices.Contains(got, refused) {
		t.Errorf("after a refused reload /sluice/pools lists its pool %q: %v", refused, got)
	}
	if p, ok := lb.LookupPool(refused); ok {
		if set, managed := p.Backends(); managed || len(set) > 0 {
			t.Errorf("after a refused reload pool %q holds its persisted set %v (managed %v)", refused, set, managed)
		}
	}

	if err := caddy.Load(poolReloadConfig(t, refused, false), true); err != nil {
		t.Fatal(err)
	}
	set, managed := lb.GetPool(refused).Backends()
	if !managed || len(set) != 2 || set[0].URL != saved[0].URL {
		t.Fatalf("the config using pool %q started without its persisted set: %v (managed %v)", refused, set, managed)
	}
	if !slices.Contains(listedPools(), refused) {
		t.Fatalf("pool %q, used by the running config, is not listed: %v", refused, listedPools())
	}
}

// flow_control counts a pool's replicas from its backend set when the
// proxy after it has dynamic upstreams of another kind. A set persisted by
// an earlier run is that set: the config loads, though the set is restored
// only when it starts, after the check that would refuse it.
func TestFlowControlCountsAPersistedSetAtFirstStart(t *testing.T) {
	goldenTempDirs(t)
	usePoolsDir(t)
	config := func(pool string) []byte {
		return oneRouteConfig(t, []map[string]any{
			{"handler": "flow_control", "pool": pool, "max_concurrency": 1},
			{"handler": "reverse_proxy", "dynamic_upstreams": map[string]any{"source": "a", "name": "localhost", "port": "9"}},
		})
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	bare := freshPoolName("flow-unsaved")
	if err := caddy.Load(config(bare), true); err == nil {
		t.Fatalf("flow_control on pool %q with no set and dynamic upstreams loaded; want 'no replicas known'", bare)
	}

	pool := freshPoolName("flow-saved")
	saved, _ := lb.ParseBackends([]string{"http://127.0.0.1:9", "http://127.0.0.1:10"})
	persistPool(pool, saved, zap.NewNop())
	if err := caddy.Load(config(pool), true); err != nil {
		t.Fatalf("flow_control on pool %q with a persisted set: %v", pool, err)
	}
	if set, managed := lb.GetPool(pool).Backends(); !managed || len(set) != 2 {
		t.Fatalf("pool %q started with %v (managed %v), want its persisted set", pool, set, managed)
	}
}
