package caddymodule

import (
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// simReloadConfig is a Caddy config serving inference_sim replica name on
// a free loopback port; with refuse, Caddy refuses it after it provisioned
// the replica (refusedAfter).
func simReloadConfig(t *testing.T, name string, refuse bool) []byte {
	t.Helper()
	handlers := []map[string]any{{"handler": "inference_sim", "name": name}}
	if refuse {
		handlers = refusedAfter(handlers, name)
	}
	return oneRouteConfig(t, handlers)
}

// oneRouteConfig is a Caddy config of one route of handlers on a free
// loopback port, without the admin endpoint.
func oneRouteConfig(t *testing.T, handlers []map[string]any) []byte {
	t.Helper()
	cfg := map[string]any{
		"admin": map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"test": map[string]any{
			"listen": []string{"127.0.0.1:0"},
			"routes": []map[string]any{{"handle": handlers}},
		}}}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// refusedAfter appends to handlers one whose Validate fails (an
// inference_sim named name-bad with concurrency -1), so Caddy refuses the
// whole config after it provisioned the handlers before it.
func refusedAfter(handlers []map[string]any, name string) []map[string]any {
	return append(handlers, map[string]any{"handler": "inference_sim", "name": name + "-bad", "concurrency": -1})
}

// A refused reload changes nothing that runs: the replica a test (or a
// benchmark) reaches by InferenceSimReplica is still the running config's,
// not gone because the refused config provisioned one of the same name and
// then cleaned it up.
func TestInferenceSimReplicaSurvivesARefusedReload(t *testing.T) {
	goldenTempDirs(t)
	name := freshPoolName("sim-refused-reload")
	if err := caddy.Load(simReloadConfig(t, name, false), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	running := InferenceSimReplica(name)
	if running == nil {
		t.Fatal("the running config's replica is not registered")
	}

	if err := caddy.Load(simReloadConfig(t, name, true), true); err == nil {
		t.Fatal("Caddy loaded a config with concurrency -1")
	} else {
		t.Logf("refused as it must be: %v", err)
	}
	if got := InferenceSimReplica(name); got != running {
		t.Fatalf("after a refused reload InferenceSimReplica(%q) = %p, want the running config's replica %p", name, got, running)
	}

	if err := caddy.Load(simReloadConfig(t, name+"-next", false), true); err != nil {
		t.Fatal(err)
	}
	if InferenceSimReplica(name) != nil {
		t.Fatal("a replica no config runs any more is still registered")
	}
}
