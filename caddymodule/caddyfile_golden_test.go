package caddymodule

// Caddyfile → JSON golden tests for every Sluice directive option, and
// table-driven tests that bad Caddyfiles are rejected (at adapt time, or
// by Validate/Provision of the adapted JSON) with a message that names the
// directive or option.
//
// Regenerate the golden files after an intended change with
//
//	go test ./caddymodule/ -run Golden -update
//
// and review the diff of testdata/caddyfile/*.json before committing it.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var goldenUpdate = flag.Bool("update", false, "rewrite the golden files in testdata/caddyfile")

const goldenDir = "testdata/caddyfile"

// goldenCase is one Caddyfile adapted and compared with its golden JSON.
type goldenCase struct {
	name   string            // golden file is goldenDir/name.json
	input  string            // path of the Caddyfile
	env    map[string]string // set for the test (via t.Setenv)
	unset  []string          // unset for the test, so the defaults apply
	checks []string          // substrings the compacted golden JSON must contain (a guard against a bad -update)
}

func goldenCases(t *testing.T) []goldenCase {
	t.Helper()
	inputs, err := filepath.Glob(filepath.Join(goldenDir, "*.caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatalf("no %s/*.caddyfile inputs", goldenDir)
	}
	sort.Strings(inputs)
	// Fields the reviewed golden files must show, per input: they pin the
	// option → JSON field mapping even if someone runs -update blindly.
	checks := map[string][]string{
		"load_aware_all_options": {
			`"policy":"load_aware"`,
			`"active_request":1.5`,
			`"active_tokens":3`,
			`"no_hit_lru":0.5`,
			`"queue":2`,
		},
		"global_redis_least_call_rate_unlimited": {
			`"policy":"global_redis_least"`,
			`"call_rate":-1`,
		},
		"qll_all_options": {
			`"policy":"queued_least_latency"`,
			`"pool":"gpu-a"`,
			`"latency_threshold":3000000000`,
			`"ewma_alpha":0.25`,
			`"queue_max_size":500`,
			`"queue_timeout":1200000000000`,
			`"state_log_interval":45000000000`,
			`"max_concurrency":4`,
			`"parallelism":8`,
			`"max_fails":3`,
			`"fail_duration":10000000000`,
			`"latency_measure":"first_byte"`,
		},
		"qll_seconds_and_disabled": {
			`"pool":"pool_2.b"`,
			`"latency_threshold":50000000`,
			`"ewma_alpha":1`,
			`"queue_max_size":-1`,
			`"queue_timeout":2500000000`,
			`"state_log_interval":-1000000000`,
			`"max_concurrency":1`,
			`"parallelism":1`,
			`"max_fails":1`,
			`"fail_duration":250000000`,
			`"latency_measure":"last_byte"`,
			`"latency_threshold":60000000000`,
			`"queue_timeout":86400000000000`,
			`"latency_measure":"auto"`,
		},
		"cache_aware_kv_events": {
			`"kv_events":"tcp://127.0.0.1:5557"`,
			`"kv_events_tokenizer":"llmd_sim"`,
			`"kv_events_fresh":45000000000`,
		},
		"cache_aware_kv_events_engine": {
			`"kv_events":"tcp://10.0.0.2:5557"`,
			`"kv_events_tokenize_timeout":500000000`,
			`"kv_events_tokenize_cache":1048576`,
			`"kv_events_tokenize_concurrency":8`,
			`"kv_events_replay_port":5558`,
		},
		"cache_aware_shared": {
			`"redis":["10.0.0.5:6379","10.0.0.6:6379"]`,
			`"username":"sluice"`,
			`"db":2`,
			`"tls":true`,
			`"read_timeout":300000000`,
			`"key_prefix":"prod"`,
		},
		"flow_control_shared": {
			`"redis":["10.0.0.5:6379"]`,
			`"key_prefix":"prod"`,
			`"read_timeout":200000000`,
			`"lease_ttl":3000000000`,
			`"fallback_share":0.25`,
		},
		"qll_defaults": {
			`"selection_policy":{"policy":"queued_least_latency"}`,
			`"selection_policy":{"policy":"queued_least_latency","pool":"auto"}`,
		},
		"dynamic_custom_router": {
			`"dynamic_upstreams":{"source":"custom_router"}`,
			`"dynamic_upstreams":{"pool":"gpu-b","source":"custom_router"}`,
		},
		"custom_router_all_options": {
			`"handler":"custom_router"`,
			`"pool":"gpu-c"`,
			`"token":"s3cret-token"`,
			`"sglang_api":false`,
			`"sglang_api":true`,
			`"http://10.0.0.1:8000",`,
			`"https://replica-2.internal:8443",`,
			`"http://[fd00::3]:8000"`,
			`"pool":"mypool"`,
			`"token":"{env.SLUICE_ROUTER_TOKEN}"`,
		},
		"inference_sim_all_options": {
			`"handler":"inference_sim"`,
			`"name":"replica-1"`,
			`"model":"llama-sim"`,
			`"concurrency":4`,
			`"kind":"lognormal"`,
			`"duration":200000000`,
			`"sigma":0.3`,
			`"max_tokens":64`,
			`"stream_chunk_tokens":4`,
			`"max_body_bytes":1048576`,
			`"error_rate":0.05`,
			`"error_status":503`,
			`"stall":30000000000`,
			`"stall_rate":0.01`,
			`"seed":42`,
			`"kind":"fixed"`,
			`"duration":150000000`,
			`"kind":"per_token"`,
			`"prefill":1000000`,
			`"decode":20000000`,
			`"batch_slowdown":0.05`,
			`"prefill":500000`,
			`"decode":10000000`,
			`"name":"replica-5"`,
			`"kind":"engine"`,
			`"step_base":20000000`,
			`"step_per_token":250000`,
			`"kv_blocks":512`,
			`"block_tokens":32`,
			`"max_batch_tokens":4096`,
			`"preset":"calibrated_engine"`,
			`"preset_time_scale":0.1`,
		},
	}
	var cases []goldenCase
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".caddyfile")
		cases = append(cases, goldenCase{name: name, input: in, checks: checks[name]})
	}
	return append(cases,
		goldenCase{
			name:  "repo_Caddyfile.example",
			input: filepath.Join("..", "Caddyfile.example"),
			checks: []string{
				`"listen":[":3000"]`,
				`"handler":"custom_router"`,
				`"http://127.0.0.1:8004"`,
				`"source":"custom_router"`,
				`"selection_policy":{"policy":"queued_least_latency","pool":"default","queue_max_size":1000,"queue_timeout":1200000000000}`,
				`"queue_timeout":1200000000000`,
				`"handler":"inference_sim"`,
				`"name":"replica-4"`,
				`"duration":400000000`,
			},
		},
		goldenCase{
			name:  "repo_Caddyfile.hf",
			input: filepath.Join("..", "Caddyfile.hf"),
			env: map[string]string{
				"CUSTOM_ROUTER_PORT":               "3001",
				"CUSTOM_ROUTER_LATENCY_THRESHOLD":  "0.05",
				"CUSTOM_ROUTER_QUEUE_MAX_SIZE":     "200",
				"CUSTOM_ROUTER_FIRST_BYTE_TIMEOUT": "900",
			},
			// Not set: the Caddyfile's defaults (the reference router's) apply.
			unset: []string{"CUSTOM_ROUTER_EWMA_ALPHA", "CUSTOM_ROUTER_QUEUE_TIMEOUT", "CUSTOM_ROUTER_STATE_LOG_INTERVAL"},
			checks: []string{
				`"listen":[":3001"]`,
				`"latency_threshold":50000000`,
				`"queue_max_size":200`,
				`"ewma_alpha":0.3`,
				`"queue_timeout":1200000000000`,
				`"state_log_interval":30000000000`,
				`"persist":false`,
				`"dial_timeout":5000000000`,
				// The platform's private network reaches the router: no
				// SGLang worker API beside the set-backends contract.
				`"sglang_api":false`,
				`"first_byte_timeout":900000000000`,
			},
		},
		goldenCase{
			name:  "repo_Caddyfile.hf_adaptive",
			input: filepath.Join("..", "Caddyfile.hf"),
			// CUSTOM_ROUTER_LATENCY_THRESHOLD unset: "auto", no threshold
			// in the JSON (adaptive).
			unset: []string{"CUSTOM_ROUTER_PORT", "CUSTOM_ROUTER_LATENCY_THRESHOLD", "CUSTOM_ROUTER_EWMA_ALPHA",
				"CUSTOM_ROUTER_QUEUE_MAX_SIZE", "CUSTOM_ROUTER_QUEUE_TIMEOUT", "CUSTOM_ROUTER_STATE_LOG_INTERVAL",
				"CUSTOM_ROUTER_FIRST_BYTE_TIMEOUT"},
			checks: []string{
				// No first-byte limit, as the reference router has none (a
				// diffusion job may take minutes before its first byte).
				`"selection_policy":{"ewma_alpha":0.3,"first_byte_timeout":-1000000000,"policy":"queued_least_latency","pool":"default","queue_max_size":1000,"queue_timeout":1200000000000,"state_log_interval":30000000000}`,
			},
		},
	)
}

// goldenAdapt runs Caddy's Caddyfile adapter on src and returns the JSON
// indented with tabs (the adapter's output is deterministic: Go's
// encoding/json sorts map keys and struct fields keep their order).
func goldenAdapt(t *testing.T, filename string, src []byte) ([]byte, []caddyconfig.Warning, error) {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("caddyfile adapter not registered")
	}
	out, warns, err := adapter.Adapt(src, map[string]any{"filename": filename})
	if err != nil {
		return nil, warns, err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, out, "", "\t"); err != nil {
		t.Fatalf("adapter output is not JSON: %v\n%s", err, out)
	}
	buf.WriteByte('\n')
	return buf.Bytes(), warns, nil
}

func goldenSetEnv(t *testing.T, set map[string]string, unset []string) {
	t.Helper()
	for k, v := range set {
		t.Setenv(k, v)
	}
	for _, k := range unset {
		t.Setenv(k, "") // records the old value, restored at cleanup
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCaddyfileGolden(t *testing.T) {
	for _, tc := range goldenCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			goldenSetEnv(t, tc.env, tc.unset)
			src, err := os.ReadFile(tc.input)
			if err != nil {
				t.Fatal(err)
			}
			got, warns, err := goldenAdapt(t, filepath.Base(tc.input), src)
			if err != nil {
				t.Fatalf("adapting %s: %v", tc.input, err)
			}
			for _, w := range warns {
				t.Errorf("adapter warning for %s: %s", tc.input, w.String())
			}
			goldenPath := filepath.Join(goldenDir, tc.name+".json")
			if *goldenUpdate {
				if err := os.WriteFile(goldenPath, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(goldenPath)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s adapts to JSON that differs from %s (- golden, + got; run with -update if intended):\n%s",
					tc.input, goldenPath, goldenLineDiff(string(want), string(got)))
			}
			var compact bytes.Buffer
			if err := json.Compact(&compact, want); err != nil {
				t.Fatalf("%s is not JSON: %v", goldenPath, err)
			}
			for _, c := range tc.checks {
				if !strings.Contains(compact.String(), c) {
					t.Errorf("%s does not contain %s", goldenPath, c)
				}
			}
			// Every Sluice module in the golden config must also pass its
			// own validation: the examples are meant to load.
			if err := goldenValidateSluice(t, got, false); err != nil {
				t.Errorf("%s: adapted config does not validate: %v", tc.input, err)
			}
		})
	}
}

// TestCaddyfileGoldenDirectiveOrder checks that custom_router runs before
// reverse_proxy in a route even when the Caddyfile lists it after.
func TestCaddyfileGoldenDirectiveOrder(t *testing.T) {
	got, _, err := goldenAdapt(t, "Caddyfile", []byte(`:8080 {
	reverse_proxy {
		dynamic custom_router
	}
	respond /x 200
	custom_router
	inference_sim
}
`))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []struct {
							Handler string `json:"handler"`
							Routes  []struct {
								Handle []struct {
									Handler string `json:"handler"`
								} `json:"handle"`
							} `json:"routes"`
						} `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(got, &cfg); err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, srv := range cfg.Apps.HTTP.Servers {
		for _, r := range srv.Routes {
			for _, h := range r.Handle {
				if h.Handler != "subroute" {
					order = append(order, h.Handler)
					continue
				}
				for _, sr := range h.Routes {
					for _, sh := range sr.Handle {
						order = append(order, sh.Handler)
					}
				}
			}
		}
	}
	idx := func(name string) int {
		for i, h := range order {
			if h == name {
				return i
			}
		}
		t.Fatalf("handler %s not in route: %v\n%s", name, order, got)
		return -1
	}
	if !(idx("custom_router") < idx("reverse_proxy")) {
		t.Errorf("custom_router must come before reverse_proxy, got %v", order)
	}
	if !(idx("inference_sim") < idx("static_response")) {
		t.Errorf("inference_sim must come before respond, got %v", order)
	}
}

// goldenValidateSluice finds every Sluice module in an adapted JSON config
// and checks it the way Caddy would at load: Validate for the pure checks
// (queued_least_latency, inference_sim), and, when provision is true,
// Provision for custom_router and the custom_router upstream source (their
// checks live in Provision). It returns the first error.
//
// Provision touches package-level pool state once a module is valid, so
// callers pass provision=true only for configs whose pools are private to
// the test.
func goldenValidateSluice(t *testing.T, cfgJSON []byte, provision bool) error {
	t.Helper()
	objs := jsonObjects(t, cfgJSON)

	var ctx caddy.Context
	if provision {
		goldenTempDirs(t)
		var cancel context.CancelFunc
		ctx, cancel = caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
	}
	for _, o := range objs {
		raw, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case o["policy"] == "queued_least_latency":
			var p QueuedLeastLatency
			if err := goldenStrictUnmarshal(raw, &p, "policy"); err != nil {
				return err
			}
			if err := p.Validate(); err != nil {
				return err
			}
		case o["policy"] == "global_redis_least":
			var p GlobalRedisLeast
			if err := goldenStrictUnmarshal(raw, &p, "policy"); err != nil {
				return err
			}
			if err := p.Validate(); err != nil {
				return err
			}
		case o["policy"] == "load_aware":
			var p LoadAware
			if err := goldenStrictUnmarshal(raw, &p, "policy"); err != nil {
				return err
			}
			if err := p.Validate(); err != nil {
				return err
			}
		case o["policy"] == "cache_aware":
			var p CacheAware
			if err := goldenStrictUnmarshal(raw, &p, "policy"); err != nil {
				return err
			}
			if err := p.Validate(); err != nil {
				return err
			}
		case o["handler"] == "flow_control":
			var h FlowControl
			if err := goldenStrictUnmarshal(raw, &h, "handler"); err != nil {
				return err
			}
			if err := h.Validate(); err != nil {
				return err
			}
		case o["handler"] == "inference_sim":
			var s InferenceSim
			if err := goldenStrictUnmarshal(raw, &s, "handler"); err != nil {
				return err
			}
			if err := s.Validate(); err != nil {
				return err
			}
		case o["handler"] == "custom_router":
			var h CustomRouter
			if err := goldenStrictUnmarshal(raw, &h, "handler"); err != nil {
				return err
			}
			if provision {
				if err := h.Provision(ctx); err != nil {
					return err
				}
			}
		case o["source"] == "custom_router":
			var u CustomRouterUpstreams
			if err := goldenStrictUnmarshal(raw, &u, "source"); err != nil {
				return err
			}
			if provision {
				if err := u.Provision(ctx); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// goldenStrictUnmarshal decodes a module object into v, rejecting fields
// the Go type does not have (Caddy itself ignores them silently, so a field
// name typo in an adapter would otherwise go unnoticed). nameKey is the
// module's inline name key ("handler", "policy", "source").
func goldenStrictUnmarshal(raw []byte, v any, nameKey string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	delete(m, nameKey)
	b, _ := json.Marshal(m)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding %T: %v", v, err)
	}
	return nil
}

// goldenTempDirs keeps Caddy's data and config dirs (persisted backend
// sets, autosave) out of the home directory.
func goldenTempDirs(t *testing.T) {
	t.Helper()
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
}

// goldenLineDiff is a small line-based diff (longest common subsequence)
// that prints the changed lines with their line numbers and one line of
// context.
func goldenLineDiff(want, got string) string {
	a := strings.Split(want, "\n")
	b := strings.Split(got, "\n")
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte
		num  int
		text string
	}
	var lines []line
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			lines = append(lines, line{' ', j + 1, a[i]})
			i++
			j++
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			lines = append(lines, line{'+', j + 1, b[j]})
			j++
		default:
			lines = append(lines, line{'-', i + 1, a[i]})
			i++
		}
	}
	var sb strings.Builder
	last := -1
	for k, l := range lines {
		show := l.op != ' ' ||
			(k > 0 && lines[k-1].op != ' ') ||
			(k+1 < len(lines) && lines[k+1].op != ' ')
		if !show {
			continue
		}
		if last >= 0 && k > last+1 {
			sb.WriteString("   ...\n")
		}
		fmt.Fprintf(&sb, "%c %4d %s\n", l.op, l.num, l.text)
		last = k
	}
	return sb.String()
}

// goldenErrCase is a bad Caddyfile: adapting it, or validating/provisioning
// the Sluice modules of the adapted JSON, must fail with an error that
// contains every string of want.
type goldenErrCase struct {
	name string
	src  string
	want []string
}

func goldenSite(body string) string {
	return ":8080 {\n" + body + "\n}\n"
}

func goldenQLL(opts string) string {
	return goldenSite("reverse_proxy 127.0.0.1:9001 {\n\tlb_policy queued_least_latency {\n" + opts + "\n\t}\n}")
}

func goldenCacheAware(opts string) string {
	return goldenSite("reverse_proxy 127.0.0.1:9001 {\n\tlb_policy cache_aware {\n" + opts + "\n\t}\n}")
}

func goldenLoadAware(opts string) string {
	return goldenSite("reverse_proxy 127.0.0.1:9001 {\n\tlb_policy load_aware {\n" + opts + "\n\t}\n}")
}

func goldenRedis(opts string) string {
	return goldenSite("reverse_proxy 127.0.0.1:9001 {\n\tlb_policy global_redis_least {\n" + opts + "\n\t}\n}")
}

func goldenFlow(opts string) string {
	return goldenSite("flow_control {\n" + opts + "\n}\nreverse_proxy 127.0.0.1:9001")
}

func goldenCustomRouter(block string) string {
	return goldenSite("custom_router {\n" + block + "\n}\nreverse_proxy {\n\tdynamic custom_router golden-err\n}")
}

func goldenDynamic(args string) string {
	return goldenSite("reverse_proxy {\n\tdynamic custom_router " + args + "\n}")
}

func goldenSim(block string) string {
	return goldenSite("inference_sim {\n" + block + "\n}")
}

func TestCaddyfileErrors(t *testing.T) {
	cases := []goldenErrCase{
		// lb_policy queued_least_latency: parse errors.
		{"qll/unknown option", goldenQLL("bogus_option 1"), []string{"queued_least_latency", "bogus_option"}},
		{"qll/engine_metrics maybe", goldenQLL("engine_metrics maybe"), []string{"queued_least_latency", "engine_metrics", "maybe"}},
		{"qll/metrics_path relative", goldenQLL("metrics_path metrics"), []string{"queued_least_latency", "metrics_path"}},
		{"qll/metrics_interval 0", goldenQLL("metrics_interval 0"), []string{"queued_least_latency", "metrics_interval"}},
		{"cache_aware/unknown option", goldenCacheAware("bogus 1"), []string{"cache_aware", "bogus"}},
		{"cache_aware/redis no address", goldenCacheAware("redis"), []string{"redis"}},
		{"cache_aware/redis not host:port", goldenCacheAware("redis nohost"), []string{"redis"}},
		{"cache_aware/db -1", goldenCacheAware("redis 127.0.0.1:6379\n\t\tdb -1"), []string{"db"}},
		{"load_aware/unknown option", goldenLoadAware("bogus 1"), []string{"load_aware", "bogus"}},
		{"global_redis_least/unknown option", goldenRedis("bogus 1"), []string{"global_redis_least", "bogus"}},
		{"flow_control/unknown option", goldenFlow("bogus 1"), []string{"flow_control", "bogus"}},
		{"flow_control/redis with utilization", goldenFlow("redis 127.0.0.1:6379\n\tdetector utilization"), []string{"flow_control", "redis", "utilization"}},
		{"flow_control/fallback_share 2", goldenFlow("redis 127.0.0.1:6379\n\tfallback_share 2"), []string{"fallback_share"}},
		{"flow_control/fallback_share -1", goldenFlow("redis 127.0.0.1:6379\n\tfallback_share -1"), []string{"fallback_share"}},
		{"flow_control/lease_ttl shorter than reads", goldenFlow("redis 127.0.0.1:6379\n\tlease_ttl 100ms"), []string{"lease_ttl"}},
		{"flow_control/redis not host:port", goldenFlow("redis nohost"), []string{"redis"}},
		{"flow_control/bad cidr", goldenFlow("trusted_sources 10.0.0.0/33"), []string{"trusted_sources"}},
		{"flow_control/objective arity", goldenFlow("objective premium"), []string{"objective"}},
		{"flow_control/objective priority", goldenFlow("objective premium high"), []string{"premium"}},
		{"flow_control/max_bytes", goldenFlow("max_bytes 10Qi"), []string{"max_bytes"}},
		{"flow_control/band priority", goldenFlow("band high {\n}"), []string{"band"}},
		{"flow_control/band unknown option", goldenFlow("band 5 {\n\tcolour red\n}"), []string{"band: 5: colour", "unknown option"}},
		{"flow_control/band fairness", goldenFlow("band 5 {\n\tfairness lottery\n}"), []string{"fairness"}},
		{"flow_control/band ordering", goldenFlow("band 5 {\n\tordering random\n}"), []string{"ordering"}},
		{"flow_control/band max_bytes", goldenFlow("band 5 {\n\tmax_bytes -1\n}"), []string{"max_bytes"}},
		{"flow_control/detector", goldenFlow("detector magic"), []string{"detector"}},
		{"flow_control/headroom", goldenFlow("headroom 2"), []string{"headroom"}},
		{"flow_control/kv_cache_threshold", goldenFlow("kv_cache_threshold 1.5"), []string{"kv_cache_threshold"}},
		{"flow_control/concurrency_mode", goldenFlow("concurrency_mode bytes"), []string{"concurrency_mode"}},
		{"global_redis_least/no address", goldenRedis("redis"), []string{"redis"}},
		{"global_redis_least/db -1", goldenRedis("db -1"), []string{"db"}},
		{"global_redis_least/tls maybe", goldenRedis("tls maybe"), []string{"tls"}},
		{"global_redis_least/max_inflight x", goldenRedis("max_inflight lots"), []string{"max_inflight"}},
		{"global_redis_least/lease_ttl soon", goldenRedis("lease_ttl soon"), []string{"lease_ttl"}},
		{"global_redis_least/breaker_failures 0", goldenRedis("breaker_failures 0"), []string{"breaker_failures"}},
		{"global_redis_least/call_rate -2", goldenRedis("call_rate -2"), []string{"call_rate"}},
		{"global_redis_least/call_rate often", goldenRedis("call_rate often"), []string{"call_rate"}},
		{"global_redis_least/two values", goldenRedis("key_prefix a b"), []string{"key_prefix"}},
		{"global_redis_least/missing ca_file", goldenRedis("tls on\nca_file /nonexistent/ca.pem"), []string{"ca_file"}},
		{"load_aware/unknown scorer", goldenLoadAware("scorer prefix_magic"), []string{"prefix_magic"}},
		{"load_aware/bad weight", goldenLoadAware("scorer queue heavy"), []string{"queue", "heavy"}},
		{"load_aware/negative weight", goldenLoadAware("scorer queue -1"), []string{"queue"}},
		{"load_aware/all weights zero", goldenLoadAware("scorer queue 0"), []string{"scorer"}},
		{"load_aware/threshold 0.5", goldenLoadAware("threshold 0.5"), []string{"threshold"}},
		{"load_aware/lru_size 0", goldenLoadAware("lru_size 0"), []string{"lru_size"}},
		{"load_aware/max_num_endpoints 0", goldenLoadAware("max_num_endpoints 0"), []string{"max_num_endpoints"}},
		{"load_aware/adaptive_step 3", goldenLoadAware("adaptive_step 3"), []string{"adaptive_step"}},
		{"load_aware/slo soon", goldenLoadAware("slo soon"), []string{"slo"}},
		{"load_aware/missing value", goldenLoadAware("threshold"), []string{"load_aware", "threshold"}},
		{"cache_aware/argument", goldenSite("reverse_proxy 127.0.0.1:9001 {\n\tlb_policy cache_aware extra\n}"), []string{"cache_aware", "extra"}},
		{"cache_aware/missing value", goldenCacheAware("cache_threshold"), []string{"cache_aware", "cache_threshold"}},
		{"cache_aware/cache_threshold 1.5", goldenCacheAware("cache_threshold 1.5"), []string{"cache_threshold"}},
		{"cache_aware/cache_threshold NaN", goldenCacheAware("cache_threshold NaN"), []string{"cache_threshold"}},
		{"cache_aware/balance_abs_threshold -3", goldenCacheAware("balance_abs_threshold -3"), []string{"balance_abs_threshold"}},
		{"cache_aware/balance_rel_threshold 0.5", goldenCacheAware("balance_rel_threshold 0.5"), []string{"balance_rel_threshold"}},
		{"cache_aware/balance_rel_threshold Inf", goldenCacheAware("balance_rel_threshold Inf"), []string{"balance_rel_threshold"}},
		{"cache_aware/max_tree_size 0", goldenCacheAware("max_tree_size 0"), []string{"max_tree_size"}},
		{"cache_aware/eviction_interval 0", goldenCacheAware("eviction_interval 0"), []string{"eviction_interval"}},
		{"cache_aware/miss_policy random", goldenCacheAware("miss_policy random"), []string{"miss_policy"}},
		{"cache_aware/max_body_bytes x", goldenCacheAware("max_body_bytes lots"), []string{"max_body_bytes"}},
		{"cache_aware/bad pool", goldenCacheAware("pool a/b"), []string{"pool"}},
		{"cache_aware/kv_events not tcp", goldenCacheAware("kv_events ipc:///tmp/kv\n\t\tkv_events_tokenizer llmd_sim"), []string{"cache_aware", "kv_events", "tcp://host:port"}},
		{"cache_aware/kv_events no port", goldenCacheAware("kv_events tcp://127.0.0.1\n\t\tkv_events_tokenizer llmd_sim"), []string{"kv_events", "tcp://127.0.0.1"}},
		{"cache_aware/kv_events port 0", goldenCacheAware("kv_events tcp://127.0.0.1:0\n\t\tkv_events_tokenizer llmd_sim"), []string{"kv_events", "port"}},
		{"cache_aware/kv_events_tokenize_timeout 0", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenize_timeout 0"), []string{"kv_events_tokenize_timeout"}},
		{"cache_aware/kv_events_tokenize_timeout 1h", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenize_timeout 1h"), []string{"cache_aware", "kv_events_tokenize_timeout", "1m0s"}},
		{"cache_aware/kv_events_tokenize_cache 0", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenize_cache 0"), []string{"kv_events_tokenize_cache"}},
		{"cache_aware/kv_events_tokenize_cache 8 GiB", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenize_cache 8589934592"), []string{"kv_events_tokenize_cache", "8589934592"}},
		{"cache_aware/kv_events_tokenize_concurrency 1000", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenize_concurrency 1000"), []string{"kv_events_tokenize_concurrency", "1000"}},
		{"cache_aware/kv_events_tokenize_concurrency x", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenize_concurrency lots"), []string{"kv_events_tokenize_concurrency"}},
		{"cache_aware/kv_events_tokenize_* with llmd_sim", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenizer llmd_sim\n\t\tkv_events_tokenize_timeout 1s"), []string{"kv_events_tokenize_timeout", "llmd_sim"}},
		{"cache_aware/kv_events_tokenize_cache alone", goldenCacheAware("kv_events_tokenize_cache 1024"), []string{"kv_events_tokenize_", "need kv_events"}},
		{"cache_aware/kv_events_tokenizer unknown", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenizer hf"), []string{"kv_events_tokenizer", "hf"}},
		{"cache_aware/kv_events_fresh 0", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_tokenizer llmd_sim\n\t\tkv_events_fresh 0"), []string{"kv_events_fresh"}},
		{"cache_aware/kv_events_tokenizer alone", goldenCacheAware("kv_events_tokenizer llmd_sim"), []string{"kv_events_tokenizer", "kv_events"}},
		{"cache_aware/kv_events_replay_port alone", goldenCacheAware("kv_events_replay_port 5558"), []string{"cache_aware", "kv_events_replay_port needs kv_events"}},
		{"cache_aware/kv_events_replay_port 0", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_replay_port 0"), []string{"kv_events_replay_port", "at least 1"}},
		{"cache_aware/kv_events_replay_port 70000", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_replay_port 70000"), []string{"cache_aware", "kv_events_replay_port", "70000", "65535"}},
		{"cache_aware/kv_events_replay_port x", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_replay_port replay"), []string{"kv_events_replay_port", "not an integer"}},
		{"cache_aware/kv_events_replay_port two", goldenCacheAware("kv_events tcp://127.0.0.1:5557\n\t\tkv_events_replay_port 5558 5559"), []string{"kv_events_replay_port"}},
		{"qll/missing value", goldenQLL("ewma_alpha"), []string{"queued_least_latency", "ewma_alpha"}},
		{"qll/unknown option without value", goldenQLL("bogus_option"), []string{"queued_least_latency", "bogus_option"}},
		{"qll/too many values", goldenQLL("queue_max_size 1 2"), []string{"queued_least_latency", "queue_max_size"}},
		// Regression case (found by the golden tests, fixed in the adapter).
		{"qll/argument on policy line", goldenSite("reverse_proxy 127.0.0.1:9001 {\n\tlb_policy queued_least_latency extra\n}"), []string{"queued_least_latency"}},
		{"qll/ewma_alpha notanumber", goldenQLL("ewma_alpha notanumber"), []string{"ewma_alpha", "notanumber"}},
		{"qll/latency_threshold soon", goldenQLL("latency_threshold soon"), []string{"latency_threshold", "soon"}},
		{"qll/queue_timeout bad", goldenQLL("queue_timeout forever"), []string{"queue_timeout"}},
		{"qll/state_log_interval bad", goldenQLL("state_log_interval often"), []string{"state_log_interval"}},
		{"qll/fail_duration bad", goldenQLL("fail_duration 5x"), []string{"fail_duration"}},
		{"qll/queue_max_size bad", goldenQLL("queue_max_size 10.5"), []string{"queue_max_size"}},
		{"qll/max_concurrency bad", goldenQLL("max_concurrency lots"), []string{"max_concurrency"}},
		{"qll/parallelism bad", goldenQLL("parallelism 1.5"), []string{"parallelism"}},
		{"qll/max_fails bad", goldenQLL("max_fails none"), []string{"max_fails"}},
		// lb_policy queued_least_latency: semantic errors (Validate).
		{"qll/ewma_alpha 1.5", goldenQLL("ewma_alpha 1.5"), []string{"ewma_alpha"}},
		{"qll/ewma_alpha negative", goldenQLL("ewma_alpha -0.1"), []string{"ewma_alpha"}},
		// Regression case (found by the golden tests, fixed in the adapter).
		{"qll/ewma_alpha NaN", goldenQLL("ewma_alpha NaN"), []string{"ewma_alpha"}},
		// Regression case (found by the golden tests, fixed in the adapter).
		{"qll/ewma_alpha Inf", goldenQLL("ewma_alpha Inf"), []string{"ewma_alpha"}},
		// Regression case (found by the golden tests, fixed in the adapter).
		{"qll/latency_threshold NaN", goldenQLL("latency_threshold NaN"), []string{"latency_threshold"}},
		// Regression case (found by the golden tests, fixed in the adapter).
		{"qll/parallelism 0", goldenQLL("parallelism 0"), []string{"parallelism"}},
		{"qll/parallelism negative", goldenQLL("parallelism -1"), []string{"parallelism"}},
		{"qll/queue_max_size -2", goldenQLL("queue_max_size -2"), []string{"queue_max_size"}},
		{"qll/latency_measure sometimes", goldenQLL("latency_measure sometimes"), []string{"latency_measure", "sometimes"}},
		{"qll/bad pool name", goldenQLL(`pool "a/b"`), []string{"queued_least_latency", "pool", "a/b"}},
		{"qll/latency_threshold negative", goldenQLL("latency_threshold -1"), []string{"latency_threshold"}},
		{"qll/queue_timeout negative", goldenQLL("queue_timeout -5s"), []string{"queue_timeout"}},
		{"qll/max_concurrency negative", goldenQLL("max_concurrency -1"), []string{"max_concurrency"}},
		{"qll/max_fails negative", goldenQLL("max_fails -1"), []string{"max_fails"}},
		{"qll/fail_duration negative", goldenQLL("fail_duration -1s"), []string{"fail_duration"}},

		// custom_router handler: parse errors.
		{"custom_router/unknown option", goldenCustomRouter("bogus_option x"), []string{"custom_router", "bogus_option"}},
		{"custom_router/missing value", goldenCustomRouter("token"), []string{"custom_router", "token"}},
		{"custom_router/too many values", goldenCustomRouter("pool a b"), []string{"custom_router", "pool"}},
		{"custom_router/sglang_api maybe", goldenCustomRouter("sglang_api maybe"), []string{"custom_router", "sglang_api", "maybe"}},
		{"custom_router/backends without URL", goldenCustomRouter("backends"), []string{"custom_router", "backends"}},
		// Regression case (found by the golden tests, fixed in the adapter).
		{"custom_router/second backends line empty", goldenCustomRouter("backends http://10.0.0.1:8000\nbackends"), []string{"custom_router", "backends"}},
		{"custom_router/too many arguments", goldenSite("custom_router a b"), []string{"custom_router"}},
		// custom_router handler: semantic errors (Provision).
		{"custom_router/backends ftp", goldenCustomRouter("backends ftp://x:1"), []string{"custom_router", "backends", "ftp://x:1"}},
		{"custom_router/backends without port", goldenCustomRouter("backends http://10.0.0.1"), []string{"custom_router", "backends", "port"}},
		{"custom_router/backends with path", goldenCustomRouter("backends http://10.0.0.1:80/v1"), []string{"custom_router", "backends"}},
		{"custom_router/bad pool name", goldenCustomRouter(`pool "a/b"`), []string{"custom_router", "pool", "a/b"}},
		{"custom_router/bad short-form pool name", goldenSite(`custom_router "a/b"`), []string{"custom_router", "pool", "a/b"}},

		// dynamic custom_router.
		// Regression case (found by the golden tests, fixed in the adapter).
		{"dynamic/too many arguments", goldenDynamic("a b"), []string{"custom_router"}},
		{"dynamic/block", goldenDynamic("a {\n\t\tpool b\n\t}"), []string{"dynamic custom_router"}},
		{"dynamic/bad pool name", goldenDynamic(`"a/b"`), []string{"dynamic custom_router", "pool", "a/b"}},

		// inference_sim.
		{"inference_sim/unknown option", goldenSim("bogus_option 1"), []string{"inference_sim", "bogus_option"}},
		{"inference_sim/missing value", goldenSim("concurrency"), []string{"concurrency"}},
		// Regression case (found by the golden tests, fixed in the adapter).
		{"inference_sim/too many values", goldenSim("model a b"), []string{"model"}},
		{"inference_sim/too many arguments", goldenSite("inference_sim a b"), []string{"inference_sim"}},
		{"inference_sim/repeated option", goldenSim("seed 1\nseed 2"), []string{"inference_sim", "seed"}},
		{"inference_sim/concurrency 0", goldenSim("concurrency 0"), []string{"inference_sim", "concurrency"}},
		{"inference_sim/max_tokens bad", goldenSim("max_tokens many"), []string{"inference_sim", "max_tokens"}},
		{"inference_sim/stream_chunk 0", goldenSim("stream_chunk 0"), []string{"inference_sim", "stream_chunk"}},
		{"inference_sim/max_body 0", goldenSim("max_body 0"), []string{"inference_sim", "max_body"}},
		{"inference_sim/error_rate 2", goldenSim("error_rate 2"), []string{"inference_sim", "error_rate"}},
		{"inference_sim/error_status 200", goldenSim("error_status 200"), []string{"inference_sim", "error_status"}},
		{"inference_sim/stall one value", goldenSim("stall 1s"), []string{"inference_sim", "stall"}},
		{"inference_sim/stall zero duration", goldenSim("stall 0s 0.5"), []string{"inference_sim", "stall"}},
		{"inference_sim/seed negative", goldenSim("seed -1"), []string{"inference_sim", "seed"}},
		{"inference_sim/latency without model", goldenSim("latency"), []string{"inference_sim", "latency"}},
		{"inference_sim/latency unknown model", goldenSim("latency gamma 1s"), []string{"inference_sim", "latency", "gamma"}},
		{"inference_sim/latency fixed bad", goldenSim("latency fixed soon"), []string{"inference_sim", "latency fixed"}},
		{"inference_sim/latency lognormal sigma", goldenSim("latency lognormal 200ms 11"), []string{"inference_sim", "sigma"}},
		{"inference_sim/latency lognormal zero mean", goldenSim("latency lognormal 0s 0.3"), []string{"inference_sim", "mean"}},
		{"inference_sim/latency per_token extra", goldenSim("latency per_token 1ms 2ms slowdown 3"), []string{"inference_sim", "batch_slowdown"}},
		{"inference_sim/latency negative", goldenSim("latency fixed -1s"), []string{"inference_sim", "latency fixed"}},
		{"inference_sim/latency engine one value", goldenSim("latency engine 20ms"), []string{"inference_sim", "latency engine"}},
		{"inference_sim/latency engine bad", goldenSim("latency engine 20ms soon"), []string{"inference_sim", "step_per_token"}},
		{"inference_sim/kv_blocks 0", goldenSim("latency engine 20ms 1ms\nkv_blocks 0"), []string{"inference_sim", "kv_blocks"}},
		{"inference_sim/kv_blocks without engine", goldenSim("kv_blocks 64"), []string{"inference_sim", "KVBlocks"}},
		{"inference_sim/max_batch_tokens below concurrency", goldenSim("latency engine 20ms 1ms\nconcurrency 64\nmax_batch_tokens 32"), []string{"inference_sim", "MaxBatchTokens"}},
		{"inference_sim/engine with prefix_cache", goldenSim("latency engine 20ms 1ms\nprefix_cache 64"), []string{"inference_sim", "PrefixCache"}},
		{"inference_sim/preset unknown", goldenSim("preset fast_engine"), []string{"inference_sim", "preset", "fast_engine"}},
		{"inference_sim/preset scale 0", goldenSim("preset calibrated_engine 0"), []string{"inference_sim", "time scale"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			goldenTempDirs(t)
			stage := "adapt"
			// Formatted first, so that the adapter's "not formatted" warning
			// does not hide others.
			out, warns, err := goldenAdapt(t, "Caddyfile", caddyfile.Format([]byte(tc.src)))
			for _, w := range warns {
				t.Logf("adapter warning: %s", w.String())
			}
			if err == nil {
				stage = "validate/provision"
				err = goldenValidateSluice(t, out, true)
			}
			if err == nil {
				t.Fatalf("accepted, want an error naming %q\nCaddyfile:\n%s\nJSON:\n%s", tc.want, tc.src, out)
			}
			t.Logf("%s error: %v", stage, err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s error does not name %q: %v", stage, w, err)
				}
			}
		})
	}
}

// jsonObjects lists every JSON object in a config, depth first with keys
// in sorted order (so callers see a stable order).
func jsonObjects(t *testing.T, cfgJSON []byte) []map[string]any {
	t.Helper()
	var root any
	if err := json.Unmarshal(cfgJSON, &root); err != nil {
		t.Fatalf("adapted config is not JSON: %v", err)
	}
	var objs []map[string]any
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			objs = append(objs, x)
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(x[k])
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(root)
	return objs
}
