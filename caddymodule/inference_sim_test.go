package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/sim"
)

// adaptInferenceSimCaddyfile adapts a Caddyfile and returns every handler
// object of type inference_sim, in order.
func adaptInferenceSimCaddyfile(t *testing.T, src string) ([]map[string]any, string, error) {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("caddyfile adapter not registered")
	}
	out, _, err := adapter.Adapt([]byte(src), nil)
	if err != nil {
		return nil, "", err
	}
	var cfg any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatalf("adapter output is not JSON: %v", err)
	}
	var found []map[string]any
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if x["handler"] == "inference_sim" {
				found = append(found, x)
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(cfg)
	return found, string(out), nil
}

func TestInferenceSimCaddyfileToJSON(t *testing.T) {
	handlers, raw, err := adaptInferenceSimCaddyfile(t, `
:8080 {
	inference_sim {
		name         replica-1
		model        llama-3
		concurrency  2
		latency      per_token 1ms 20ms batch_slowdown 0.05
		max_tokens   32
		stream_chunk 4
		max_body     1048576
		error_rate   0.25
		error_status 503
		stall        30s 0.01
		seed         42
	}
	respond "unreachable"
}

:8081 {
	inference_sim replica-2 {
		latency lognormal 200ms 0.5
	}
}

:8082 {
	inference_sim {
		latency fixed 1.5s
	}
}
`)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	if len(handlers) != 3 {
		t.Fatalf("found %d inference_sim handlers, want 3:\n%s", len(handlers), raw)
	}
	byName := map[string]map[string]any{}
	for _, h := range handlers {
		name, _ := h["name"].(string)
		byName[name] = h
	}

	want1 := map[string]any{
		"handler":             "inference_sim",
		"name":                "replica-1",
		"model":               "llama-3",
		"concurrency":         float64(2),
		"latency":             map[string]any{"kind": "per_token", "prefill": float64(time.Millisecond), "decode": float64(20 * time.Millisecond), "batch_slowdown": 0.05},
		"max_tokens":          float64(32),
		"stream_chunk_tokens": float64(4),
		"max_body_bytes":      float64(1 << 20),
		"error_rate":          0.25,
		"error_status":        float64(503),
		"stall":               float64(30 * time.Second),
		"stall_rate":          0.01,
		"seed":                float64(42),
	}
	assertInferenceSimJSON(t, byName["replica-1"], want1)
	assertInferenceSimJSON(t, byName["replica-2"], map[string]any{
		"handler": "inference_sim",
		"name":    "replica-2",
		"latency": map[string]any{"kind": "lognormal", "duration": float64(200 * time.Millisecond), "sigma": 0.5},
	})
	assertInferenceSimJSON(t, byName[""], map[string]any{
		"handler": "inference_sim",
		"latency": map[string]any{"kind": "fixed", "duration": float64(1500 * time.Millisecond)},
	})

	// Ordered before respond.
	if i, j := strings.Index(raw, `"inference_sim"`), strings.Index(raw, `"static_response"`); i < 0 || j < 0 || i > j {
		t.Errorf("inference_sim is not ordered before respond:\n%s", raw)
	}

	// The JSON round-trips into the module and provisions a working replica.
	body, _ := json.Marshal(byName["replica-1"])
	var mod InferenceSim
	if err := json.Unmarshal(body, &mod); err != nil {
		t.Fatal(err)
	}
	if err := mod.Provision(caddy.Context{}); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	defer mod.Cleanup()
	if err := mod.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	cfg := mod.replica.Config()
	wantCfg := sim.Config{
		Name: "replica-1", Model: "llama-3", Concurrency: 2,
		Latency:   sim.Latency{Kind: sim.LatencyPerToken, Prefill: time.Millisecond, Decode: 20 * time.Millisecond, BatchSlowdown: 0.05},
		MaxTokens: 32, StreamChunkTokens: 4, MaxBodyBytes: 1 << 20,
		Faults: sim.Faults{ErrorRate: 0.25, ErrorStatus: 503, StallRate: 0.01, Stall: 30 * time.Second},
		Seed:   42,
	}
	if cfg != wantCfg {
		t.Errorf("sim config %+v\nwant %+v", cfg, wantCfg)
	}
	if InferenceSimReplica("replica-1") != mod.replica {
		t.Error("provisioned replica not registered under its name")
	}
}

func assertInferenceSimJSON(t *testing.T, got, want map[string]any) {
	t.Helper()
	if got == nil {
		t.Fatalf("handler %v not found", want["name"])
	}
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("handler JSON\n got %s\nwant %s", g, w)
	}
}

func TestInferenceSimCaddyfileErrors(t *testing.T) {
	cases := []struct {
		block string
		want  string
	}{
		{"concurrency 0", "concurrency"},
		{"concurrency two", "concurrency"},
		{"concurrency 1 2", "wrong argument count"},
		{"latency", "latency"},
		{"latency gaussian 1s", "latency model"},
		{"latency fixed", "latency fixed"},
		{"latency fixed soon", "latency fixed duration"},
		{"latency fixed -1s", "latency fixed duration"},
		{"latency lognormal 200ms", "latency lognormal"},
		{"latency lognormal 0s 0.5", "lognormal mean"},
		{"latency lognormal 200ms -1", "sigma"},
		{"latency per_token 1ms", "per_token"},
		{"latency per_token 1ms 20ms batch 0.1", "batch_slowdown"},
		{"latency per_token 1ms 20ms batch_slowdown x", "batch_slowdown"},
		{"max_tokens 0", "max_tokens"},
		{"stream_chunk -1", "stream_chunk"},
		{"max_body lots", "max_body"},
		{"error_rate 1.5", "error_rate"},
		{"error_rate", "wrong argument count"},
		{"error_status 200", "error_status"},
		{"stall 30s", "stall"},
		{"stall 30s 2", "stall"},
		{"stall 0s 0.5", "stall"},
		{"stall never 0.5", "stall"},
		{"seed -1", "seed"},
		{"name", "name takes exactly one value"},
		{"name \"a\\\"b\"", "Name"},
		{"colour blue", "unrecognized subdirective 'colour'"},
		{"concurrency 2\n\t\tconcurrency 3", "concurrency specified more than once"},
	}
	for _, c := range cases {
		src := ":8080 {\n\tinference_sim {\n\t\t" + c.block + "\n\t}\n}\n"
		_, _, err := adaptInferenceSimCaddyfile(t, src)
		if err == nil {
			// Some values are only rejected when the module is provisioned.
			var mod InferenceSim
			d := caddyfile.NewTestDispenser("inference_sim {\n" + c.block + "\n}")
			if uerr := mod.UnmarshalCaddyfile(d); uerr != nil {
				err = uerr
			} else {
				err = mod.Validate()
			}
		}
		if err == nil {
			t.Errorf("%q: accepted, want an error mentioning %q", c.block, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "inference_sim") {
			t.Errorf("%q: error %q does not mention %q and inference_sim", c.block, err, c.want)
		}
	}
}

func TestInferenceSimServeHTTP(t *testing.T) {
	mod := &InferenceSim{Name: "caddy-sim", Latency: &InferenceSimLatency{Kind: "fixed"}}
	if err := mod.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	defer mod.Cleanup()
	nextCalled := false
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { nextCalled = true; return nil })

	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"hello"}],"max_tokens":3}`))
	if err := mod.ServeHTTP(rec, req, next); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusOK || rec.Header().Get(sim.HeaderReplica) != "caddy-sim" {
		t.Errorf("status %d headers %v body %s", rec.Code, rec.Header(), rec.Body)
	}
	if nextCalled {
		t.Error("inference_sim called the next handler")
	}
	if st := InferenceSimReplica("caddy-sim").Stats(); st.Served != 1 {
		t.Errorf("stats %+v", st)
	}
	mod.Cleanup()
	if InferenceSimReplica("caddy-sim") != nil {
		t.Error("replica still registered after Cleanup")
	}
}
