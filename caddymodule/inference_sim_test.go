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
// simHandlersByName adapts a Caddyfile and indexes its inference_sim
// handlers by name ("" for an unnamed one).
func simHandlersByName(t *testing.T, src string) (map[string]map[string]any, string) {
	t.Helper()
	handlers, raw, err := adaptInferenceSimCaddyfile(t, src)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	byName := map[string]map[string]any{}
	for _, h := range handlers {
		name, _ := h["name"].(string)
		byName[name] = h
	}
	return byName, raw
}

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
	var found []map[string]any
	for _, o := range jsonObjects(t, out) {
		if o["handler"] == "inference_sim" {
			found = append(found, o)
		}
	}
	return found, string(out), nil
}

func TestInferenceSimCaddyfileToJSON(t *testing.T) {
	byName, raw := simHandlersByName(t, `
:8080 {
	inference_sim {
		name         replica-1
		model        llama-3
		concurrency  2
		latency      per_token 1ms 20ms batch_slowdown 0.05
		max_tokens   32
		stream_chunk 4
		stream_headers first_token
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
	if len(byName) != 3 {
		t.Fatalf("found %d inference_sim handlers, want 3:\n%s", len(byName), raw)
	}

	want1 := map[string]any{
		"handler":             "inference_sim",
		"name":                "replica-1",
		"model":               "llama-3",
		"concurrency":         float64(2),
		"latency":             map[string]any{"kind": "per_token", "prefill": float64(time.Millisecond), "decode": float64(20 * time.Millisecond), "batch_slowdown": 0.05},
		"max_tokens":          float64(32),
		"stream_chunk_tokens": float64(4),
		"stream_headers":      "first_token",
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
		MaxTokens: 32, StreamChunkTokens: 4, StreamHeaders: sim.StreamHeadersFirstToken, MaxBodyBytes: 1 << 20,
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
		{"stream_headers soon", "stream_headers"},
		{"stream_headers", "stream_headers"},
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
		{"max_num_seqs 0", "max_num_seqs"},
		{"max_num_seqs many", "max_num_seqs"},
		{"concurrency 2\n\t\tmax_num_seqs 3", "max_num_seqs"},
		{"max_num_seqs 2\n\t\tconcurrency 3", "max_num_seqs"},
		{"prefix_cache", "prefix_cache"},
		{"prefix_cache 96 256 1", "prefix_cache"},
		{"prefix_cache 0", "prefix_cache blocks"},
		{"prefix_cache -5", "prefix_cache blocks"},
		{"prefix_cache lots", "prefix_cache blocks"},
		{"prefix_cache 99999999999", "prefix_cache blocks"},
		{"prefix_cache 96 0", "prefix_cache block_chars"},
		{"prefix_cache 96 wide", "prefix_cache block_chars"},
		{"prefix_cache 96 2000000", "prefix_cache block_chars"},
		{"prefix_cache 1\n\t\tprefix_cache 2", "prefix_cache specified more than once"},
		{"prefill_per_token", "wrong argument count"},
		{"prefill_per_token soon", "prefill_per_token"},
		{"prefill_per_token -1ms", "prefill_per_token"},
		{"prefill_per_token 1ms 2ms", "wrong argument count"},
		{"prefill_per_token 1ms\n\t\tlatency per_token 1ms 2ms", "prefill_per_token"},
		{"latency per_token 1ms 2ms\n\t\tprefill_per_token 1ms", "prefill_per_token"},
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

func TestInferenceSimPrefixCacheOptions(t *testing.T) {
	byName, raw := simHandlersByName(t, `
:8080 {
	inference_sim px-1 {
		max_num_seqs      8
		prefill_per_token 2ms
		latency           lognormal 200ms 0.3
		prefix_cache      96 64
	}
}

:8081 {
	inference_sim px-2 {
		prefill_per_token 500us
		prefix_cache      512
	}
}

:8082 {
	inference_sim px-3 {
		latency      per_token 1ms 20ms batch_slowdown 0.05
		prefix_cache 1024
	}
}
`)
	assertInferenceSimJSON(t, byName["px-1"], map[string]any{
		"handler":      "inference_sim",
		"name":         "px-1",
		"concurrency":  float64(8),
		"latency":      map[string]any{"kind": "lognormal", "duration": float64(200 * time.Millisecond), "sigma": 0.3, "prefill_per_token": float64(2 * time.Millisecond)},
		"prefix_cache": map[string]any{"blocks": float64(96), "block_chars": float64(64)},
	})
	// prefill_per_token without a latency line: fixed 0 plus the prefill.
	assertInferenceSimJSON(t, byName["px-2"], map[string]any{
		"handler":      "inference_sim",
		"name":         "px-2",
		"latency":      map[string]any{"prefill_per_token": float64(500 * time.Microsecond)},
		"prefix_cache": map[string]any{"blocks": float64(512)},
	})
	assertInferenceSimJSON(t, byName["px-3"], map[string]any{
		"handler":      "inference_sim",
		"name":         "px-3",
		"latency":      map[string]any{"kind": "per_token", "prefill": float64(time.Millisecond), "decode": float64(20 * time.Millisecond), "batch_slowdown": 0.05},
		"prefix_cache": map[string]any{"blocks": float64(1024)},
	})
	if t.Failed() {
		t.Logf("adapted:\n%s", raw)
	}

	cfg1 := provisionSim(t, byName["px-1"]).replica.Config()
	if cfg1.Concurrency != 8 || cfg1.PrefixCache != (sim.PrefixCache{Blocks: 96, BlockChars: 64}) ||
		cfg1.Latency.PrefillPerToken != 2*time.Millisecond || cfg1.Latency.Kind != sim.LatencyLognormal {
		t.Errorf("px-1 sim config %+v", cfg1)
	}
	mod2 := provisionSim(t, byName["px-2"])
	cfg2 := mod2.replica.Config()
	if cfg2.PrefixCache != (sim.PrefixCache{Blocks: 512, BlockChars: sim.DefaultBlockChars}) ||
		cfg2.Latency.Kind != sim.LatencyFixed || cfg2.Latency.PrefillPerToken != 500*time.Microsecond {
		t.Errorf("px-2 sim config %+v", cfg2)
	}

	// Two requests sharing a long prefix through the handler: the second hits.
	serve := func(prompt string) string {
		rec := httptest.NewRecorder()
		body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(string(body)))
		if err := mod2.ServeHTTP(rec, req, nil); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("status %d err %v body %s", rec.Code, err, rec.Body)
		}
		return rec.Header().Get(sim.HeaderCachedTokens)
	}
	shared := strings.Repeat("a shared system prompt. ", 64) // 1536 chars: 6 blocks of 256
	if c := serve(shared + "first"); c != "0" {
		t.Errorf("cold request has %s cached tokens", c)
	}
	if c := serve(shared + "second"); c == "0" || c == "" {
		t.Errorf("request sharing the prefix has %q cached tokens", c)
	}
	st := mod2.replica.Stats()
	if st.PrefixHitBlocks != 6 || st.HitRate() <= 0 {
		t.Errorf("stats after two requests: %d hit blocks, hit rate %v", st.PrefixHitBlocks, st.HitRate())
	}
	if m := mod2.replica.MetricsText(); !strings.Contains(m, "vllm:prefix_cache_hits_total{") ||
		!strings.Contains(m, "vllm:prefix_cache_queries_total{") {
		t.Errorf("metrics lack the prefix cache counters:\n%s", m)
	}

	// Bad JSON values are rejected by Validate, naming the field.
	for _, c := range []struct {
		json, want string
	}{
		{`{"prefix_cache":{"blocks":-1}}`, "PrefixCache.Blocks"},
		{`{"prefix_cache":{"block_chars":64}}`, "PrefixCache.Blocks"},
		{`{"prefix_cache":{"blocks":8,"block_chars":-2}}`, "PrefixCache.BlockChars"},
		{`{"latency":{"kind":"per_token","prefill_per_token":1000}}`, "PrefillPerToken"},
		{`{"latency":{"prefill_per_token":-1000}}`, "PrefillPerToken"},
	} {
		var mod InferenceSim
		if err := json.Unmarshal([]byte(c.json), &mod); err != nil {
			t.Fatal(err)
		}
		if err := mod.Validate(); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "inference_sim") {
			t.Errorf("%s: Validate() = %v, want an error naming %s", c.json, err, c.want)
		}
	}
}

func TestInferenceSimContentionOptions(t *testing.T) {
	byName, raw := simHandlersByName(t, `
:8080 {
	inference_sim ct-1 {
		prefill_blocks_decode on
		latency               per_token 1ms 20ms
		kv_capacity_tokens    4096
	}
}

:8081 {
	inference_sim ct-2 {
		kv_capacity_tokens    100
		prefill_blocks_decode off
	}
}
`)
	assertInferenceSimJSON(t, byName["ct-1"], map[string]any{
		"handler":               "inference_sim",
		"name":                  "ct-1",
		"latency":               map[string]any{"kind": "per_token", "prefill": float64(time.Millisecond), "decode": float64(20 * time.Millisecond)},
		"prefill_blocks_decode": true,
		"kv_capacity_tokens":    float64(4096),
	})
	// prefill_blocks_decode off is the default and needs no per_token.
	assertInferenceSimJSON(t, byName["ct-2"], map[string]any{
		"handler":            "inference_sim",
		"name":               "ct-2",
		"kv_capacity_tokens": float64(100),
	})
	if t.Failed() {
		t.Logf("adapted:\n%s", raw)
	}

	mod := provisionSim(t, byName["ct-1"])
	if cfg := mod.replica.Config(); !cfg.PrefillBlocksDecode || cfg.KVCapacityTokens != 4096 {
		t.Errorf("sim config %+v", cfg)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"hello","max_tokens":1}`))
	if err := mod.ServeHTTP(rec, req, nil); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("status %d err %v body %s", rec.Code, err, rec.Body)
	}
	if st := mod.replica.Stats(); st.KVCapacityTokens != 4096 || st.KVTokens != 0 || st.Prefills != 1 || st.MaxPrefilling != 1 {
		t.Errorf("stats %+v", st)
	}
	if m := mod.replica.MetricsText(); !strings.Contains(m, `sim_kv_capacity_tokens{replica="ct-1"} 4096`) {
		t.Errorf("metrics lack the KV capacity:\n%s", m)
	}

	// Bad Caddyfile values fail naming the option.
	for _, c := range []struct {
		block, want string
	}{
		{"prefill_blocks_decode", "prefill_blocks_decode"},
		{"prefill_blocks_decode yes", "prefill_blocks_decode"},
		{"prefill_blocks_decode on off", "prefill_blocks_decode"},
		{"prefill_blocks_decode on", "prefill_blocks_decode on needs latency per_token"},
		{"prefill_blocks_decode on\n\t\tlatency fixed 10ms", "prefill_blocks_decode on needs latency per_token"},
		{"latency lognormal 10ms 0.5\n\t\tprefill_blocks_decode on", "prefill_blocks_decode on needs latency per_token"},
		{"prefill_blocks_decode on\n\t\tprefill_blocks_decode on", "prefill_blocks_decode specified more than once"},
		{"kv_capacity_tokens", "wrong argument count"},
		{"kv_capacity_tokens 0", "kv_capacity_tokens"},
		{"kv_capacity_tokens -5", "kv_capacity_tokens"},
		{"kv_capacity_tokens lots", "kv_capacity_tokens"},
		{"kv_capacity_tokens 99999999999", "kv_capacity_tokens"},
		{"kv_capacity_tokens 10 20", "wrong argument count"},
		{"kv_capacity_tokens 10\n\t\tkv_capacity_tokens 20", "kv_capacity_tokens specified more than once"},
	} {
		src := ":8080 {\n\tinference_sim {\n\t\t" + c.block + "\n\t}\n}\n"
		_, _, err := adaptInferenceSimCaddyfile(t, src)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "inference_sim") {
			t.Errorf("%q: error %v, want one mentioning %q and inference_sim", c.block, err, c.want)
		}
	}

	// Bad JSON values are rejected by Validate, naming the field.
	for _, c := range []struct {
		json, want string
	}{
		{`{"prefill_blocks_decode":true}`, "PrefillBlocksDecode"},
		{`{"prefill_blocks_decode":true,"latency":{"kind":"fixed","duration":1000}}`, "PrefillBlocksDecode"},
		{`{"kv_capacity_tokens":-1}`, "KVCapacityTokens"},
	} {
		var mod InferenceSim
		if err := json.Unmarshal([]byte(c.json), &mod); err != nil {
			t.Fatal(err)
		}
		if err := mod.Validate(); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "inference_sim") {
			t.Errorf("%s: Validate() = %v, want an error naming %s", c.json, err, c.want)
		}
	}
}

// provisionSim decodes, validates and provisions one adapted handler; it
// is cleaned up with the test.
func provisionSim(t *testing.T, h map[string]any) *InferenceSim {
	t.Helper()
	body, _ := json.Marshal(h)
	mod := new(InferenceSim)
	if err := json.Unmarshal(body, mod); err != nil {
		t.Fatal(err)
	}
	if err := mod.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if err := mod.Provision(caddy.Context{}); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	t.Cleanup(func() { _ = mod.Cleanup() })
	return mod
}

func TestInferenceSimEngineOptions(t *testing.T) {
	byName, raw := simHandlersByName(t, `
:8080 {
	inference_sim eng-1 {
		latency          engine 2ms 10us
		max_num_seqs     16
		kv_blocks        256
		block_tokens     32
		max_batch_tokens 1024
	}
}

:8081 {
	inference_sim eng-2 {
		preset     calibrated_engine 0.01
		max_tokens 4
	}
}
`)
	assertInferenceSimJSON(t, byName["eng-1"], map[string]any{
		"handler":          "inference_sim",
		"name":             "eng-1",
		"concurrency":      float64(16),
		"latency":          map[string]any{"kind": "engine", "step_base": float64(2 * time.Millisecond), "step_per_token": float64(10 * time.Microsecond)},
		"kv_blocks":        float64(256),
		"block_tokens":     float64(32),
		"max_batch_tokens": float64(1024),
	})
	assertInferenceSimJSON(t, byName["eng-2"], map[string]any{
		"handler":           "inference_sim",
		"name":              "eng-2",
		"preset":            "calibrated_engine",
		"preset_time_scale": 0.01,
		"max_tokens":        float64(4),
	})
	if t.Failed() {
		t.Logf("adapted:\n%s", raw)
	}

	mod := provisionSim(t, byName["eng-1"])
	cfg := mod.replica.Config()
	if cfg.Latency.Kind != sim.LatencyEngine || cfg.KVBlocks != 256 || cfg.BlockTokens != 32 || cfg.MaxBatchTokens != 1024 || cfg.Concurrency != 16 {
		t.Errorf("sim config %+v", cfg)
	}

	// The preset, overridden by max_tokens, and scaled.
	mod = provisionSim(t, byName["eng-2"])
	cfg = mod.replica.Config()
	want := sim.CalibratedEngine(0.01)
	if cfg.Name != "eng-2" || cfg.MaxTokens != 4 || cfg.KVBlocks != want.KVBlocks || cfg.Latency != want.Latency || cfg.Concurrency != want.Concurrency {
		t.Errorf("preset config %+v, want the preset's engine with max_tokens 4", cfg)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"hello world","stream":true}`))
	if err := mod.ServeHTTP(rec, req, nil); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("status %d err %v body %s", rec.Code, err, rec.Body)
	}
	if n := strings.Count(rec.Body.String(), "data: {"); n != 4 {
		t.Errorf("%d streamed tokens, want 4:\n%s", n, rec.Body)
	}
	if st := mod.replica.Stats(); st.Steps != 4 {
		t.Errorf("%d engine steps, want 4 (a prefill and 3 decodes)", st.Steps)
	}
}

// JSON config: a bad stream_headers is refused naming the option.
func TestInferenceSimStreamHeadersValidated(t *testing.T) {
	err := (&InferenceSim{StreamHeaders: "soon"}).Validate()
	if err == nil || !strings.Contains(err.Error(), "stream_headers") {
		t.Fatalf("stream_headers soon: %v, want an error naming stream_headers", err)
	}
	for _, ok := range []string{"", sim.StreamHeadersImmediate, sim.StreamHeadersFirstToken} {
		if err := (&InferenceSim{StreamHeaders: ok}).Validate(); err != nil {
			t.Fatalf("stream_headers %q: %v", ok, err)
		}
	}
}

// By default the handler sends a stream's headers at once: X-Sim-Seq and
// X-Sim-Cached-Tokens come as trailers (Caddy's ResponseWriter, as the
// recorder, sends the headers named with http.TrailerPrefix after the
// body); with first_token they stay headers.
func TestInferenceSimStreamTrailers(t *testing.T) {
	for _, mode := range []string{"", sim.StreamHeadersFirstToken} {
		mod := &InferenceSim{Name: "tr", PrefixCache: &InferenceSimPrefixCache{Blocks: 8}, StreamHeaders: mode}
		if err := mod.Provision(caddy.Context{}); err != nil {
			t.Fatalf("Provision: %v", err)
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":2,"stream":true}`))
		if err := mod.ServeHTTP(rec, req, nil); err != nil {
			t.Fatal(err)
		}
		_ = mod.Cleanup()
		res := rec.Result()
		meta, other := res.Header, res.Trailer
		if mode == "" {
			meta, other = res.Trailer, res.Header
		}
		if res.StatusCode != http.StatusOK || meta.Get(sim.HeaderSeq) != "1" || meta.Get(sim.HeaderCachedTokens) != "0" ||
			other.Get(sim.HeaderSeq) != "" || other.Get(sim.HeaderCachedTokens) != "" {
			t.Errorf("stream_headers %q: status %d, header %v, trailer %v", mode, res.StatusCode, res.Header, res.Trailer)
		}
	}
}
