package caddymodule

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb/qll"
)

// A pool conflict (two reverse_proxy handlers giving one Sluice pool
// different upstreams) is refused while the config is provisioned: by
// `caddy validate`, and on a reload before any app of the refused config
// starts, so none of its listeners is ever bound.

// startProbe is a Caddy app that counts its starts: in a refused config,
// it tells whether Caddy started any app of it.
type startProbe struct{}

var probeStarts atomic.Int64

func init() { caddy.RegisterModule(startProbe{}) }

func (startProbe) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "sluice_test_start_probe", New: func() caddy.Module { return new(startProbe) }}
}

func (*startProbe) Start() error { probeStarts.Add(1); return nil }
func (*startProbe) Stop() error  { return nil }

var _ caddy.App = (*startProbe)(nil)

// withProbe is config with the start probe among its apps.
func withProbe(t *testing.T, config []byte) []byte {
	t.Helper()
	var cfg map[string]any
	if err := json.Unmarshal(config, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["apps"].(map[string]any)["sluice_test_start_probe"] = map[string]any{}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withQueueMax sets a proxyOnPool handler's queue_max_size.
func withQueueMax(h map[string]any, n int) map[string]any {
	h["load_balancing"].(map[string]any)["selection_policy"].(map[string]any)["queue_max_size"] = n
	return h
}

func TestValidateRefusesAPoolConflict(t *testing.T) {
	goldenTempDirs(t)
	pool := freshPoolName("validate-conflict")
	err := validate(t, poolConfig(t, "127.0.0.1:0",
		proxyOnPool(pool, nil, "127.0.0.1:9", "127.0.0.1:10"), proxyOnPool(pool, nil, "127.0.0.1:11")))
	if err == nil {
		t.Fatalf("caddy validate accepted two reverse_proxy handlers giving pool %q different upstreams", pool)
	}
	for _, want := range []string{`pool "` + pool + `"`, "upstreams 127.0.0.1:10 127.0.0.1:9", "upstreams 127.0.0.1:11"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %v does not name %s", err, want)
		}
	}
}

// A named route's handler is provisioned once, however many sites invoke
// it; a conflicting primary route still meets it.
func TestValidateRefusesAConflictWithANamedRoute(t *testing.T) {
	goldenTempDirs(t)
	pool := freshPoolName("validate-named")
	var cfg map[string]any
	if err := json.Unmarshal(poolConfig(t, "127.0.0.1:0", proxyOnPool(pool, nil, "127.0.0.1:9"),
		map[string]any{"handler": "invoke", "name": "llm"}), &cfg); err != nil {
		t.Fatal(err)
	}
	srv := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["sites"].(map[string]any)
	srv["named_routes"] = map[string]any{"llm": map[string]any{"handle": []any{proxyOnPool(pool, nil, "127.0.0.1:10")}}}
	b, _ := json.Marshal(cfg)
	if err := validate(t, b); err == nil || !strings.Contains(err.Error(), `pool "`+pool+`"`) {
		t.Fatalf("a named route giving pool %q other upstreams: %v, want refused naming the pool", pool, err)
	}
}

// A reload refused for a pool conflict starts no app of its config (the
// refusal came while it was provisioned) and leaves the running config
// serving, with its pool's state and settings.
func TestPoolConflictReloadStartsNothing(t *testing.T) {
	usePoolsDir(t)
	running, conflict := freshPoolName("conflict-running"), freshPoolName("conflict-refused")
	a := replicaServing(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	b := replicaServing(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	url := startProxy(t, []map[string]any{{"handle": []any{withQueueMax(proxyOnPool(running, nil, a), 3)}}}, nil)
	if got := statusOf(t, completion(t, http.MethodPost, url)); got != http.StatusOK {
		t.Fatalf("the running config answered %d, want 200", got)
	}
	state := pickersOf[*qll.State]("queued_least_latency")[running]
	if state == nil {
		t.Fatalf("pool %q has no queued_least_latency state", running)
	}

	// The running pool with new settings (it would apply had the config
	// loaded), and a fresh pool given two different lists.
	refused := withProbe(t, poolConfig(t, strings.TrimPrefix(url, "http://"),
		withQueueMax(proxyOnPool(running, nil, a), 7), proxyOnPool(conflict, nil, a), proxyOnPool(conflict, nil, b)))
	before := probeStarts.Load()
	for i := range 16 { // Caddy starts apps in map order: a refusal at Start lets the probe start in about half
		err := caddy.Load(refused, true)
		if err == nil {
			t.Fatalf("Caddy loaded a config giving pool %q two upstream lists", conflict)
		}
		if !strings.Contains(err.Error(), `pool "`+conflict+`"`) {
			t.Fatalf("refusal %v does not name pool %q", err, conflict)
		}
		if i == 0 {
			t.Logf("refused as it must be: %v", err)
		}
		if n := probeStarts.Load() - before; n > 0 {
			t.Fatalf("Caddy started an app of the refused config (%d times): refused only at Start, its listeners bound meanwhile: %v", n, err)
		}
	}

	if got := statusOf(t, completion(t, http.MethodPost, url)); got != http.StatusOK {
		t.Fatalf("after the refused reload the running config answered %d, want 200", got)
	}
	if now := pickersOf[*qll.State]("queued_least_latency")[running]; now != state {
		t.Fatalf("after the refused reload pool %q has another state", running)
	}
	if got := state.Config().QueueMaxSize; got != 3 {
		t.Fatalf("after the refused reload pool %q runs with queue_max_size %d, want the running config's 3", running, got)
	}
	if got := listedPools(); slices.Contains(got, conflict) || !slices.Contains(got, running) {
		t.Fatalf("after the refused reload /sluice/pools lists %v, want %q and not %q", got, running, conflict)
	}
}

// Handlers that agree on a pool's upstreams load: the same static set in
// any order, the same pool's backend set, one named route invoked twice.
func TestAgreeingPoolSourcesLoad(t *testing.T) {
	usePoolsDir(t)
	t.Cleanup(func() { _ = caddy.Stop() })
	static, set, named := freshPoolName("agree-static"), freshPoolName("agree-set"), freshPoolName("agree-named")
	a := replicaServing(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	b := replicaServing(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	crSet := map[string]any{"source": "custom_router", "pool": set}

	var cfg map[string]any
	if err := json.Unmarshal(poolConfig(t, "127.0.0.1:0",
		proxyOnPool(static, nil, a, b), proxyOnPool(static, nil, b, a),
		proxyOnPool(set, crSet), proxyOnPool(set, crSet),
		map[string]any{"handler": "invoke", "name": "llm"}, map[string]any{"handler": "invoke", "name": "llm"},
		proxyOnPool(named, nil, a),
	), &cfg); err != nil {
		t.Fatal(err)
	}
	srv := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["sites"].(map[string]any)
	srv["named_routes"] = map[string]any{"llm": map[string]any{"handle": []any{proxyOnPool(named, nil, a)}}}
	config, _ := json.Marshal(cfg)

	goldenTempDirs(t)
	if err := validate(t, config); err != nil {
		t.Fatalf("caddy validate refused agreeing handlers: %v", err)
	}
	if err := caddy.Load(config, true); err != nil {
		t.Fatalf("Caddy refused agreeing handlers: %v", err)
	}
}

// Caddy provisions each handler once, but one handler seen again (a named
// route) agrees with itself, even with a source that agrees with nothing;
// another handler on its pool does not.
func TestPoolClaimSameHandlerAgreesWithItself(t *testing.T) {
	app := &App{mu: new(sync.Mutex)}
	h, other := new(reverseproxy.Handler), new(reverseproxy.Handler)
	dyn := poolSource{dynamic: "http.reverse_proxy.upstreams.a"}
	if err := app.claimPoolSource("p", h, dyn); err != nil {
		t.Fatal(err)
	}
	if err := app.claimPoolSource("p", h, dyn); err != nil {
		t.Fatalf("the same handler twice: %v", err)
	}
	if err := app.claimPoolSource("p", other, dyn); err == nil || !strings.Contains(err.Error(), `pool "p"`) {
		t.Fatalf("another handler with a dynamic source: %v, want refused naming the pool", err)
	}
	if err := app.claimPoolSource("q", other, dyn); err != nil {
		t.Fatalf("another pool: %v", err)
	}
}
