package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQuickRealEngine runs real-engine -quick against the simulated
// engines: R = 4 with every system (global_redis_least needs
// redis-server: skipped without it, failed under CI=true), then R = 1
// direct. It asserts only what is not timing: nothing lost, every system
// answered, every answer streamed tokens, and the per-replica counts add
// up to the answers.
func TestQuickRealEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	bin := caddyForTests(ctx, t)
	haveRedis := haveTool(t, "redis-server", "redis-server")
	if !haveRedis && os.Getenv("CI") == "true" {
		t.Fatal("redis-server is missing and could not be installed (apt-get install -y redis-server, as root)")
	}
	for _, c := range []struct {
		replicas int
		want     []string
	}{
		{4, []string{"caddy_round_robin", "caddy_least_conn", "oracle_header_hash", "sluice_queued_least_latency",
			"sluice_load_aware", "sluice_cache_aware", "sluice_global_redis_least", "sluice_flow_control"}},
		{1, []string{"direct"}},
	} {
		out := t.TempDir()
		only := ""
		if c.replicas == 1 {
			only = "direct"
		}
		res, err := Run(ctx, Options{Scenario: "real-engine", Quick: true, OutDir: out, CaddyBin: bin, Only: only,
			NoInstall: true, Command: "go test ./bench/", Log: testLog{t},
			Engine: EngineOptions{Replicas: c.replicas}})
		if err != nil {
			t.Fatal(err)
		}
		if err := res.Err(); err != nil {
			t.Errorf("R=%d: run not clean: %v", c.replicas, err)
		}
		ran := map[string]Summary{}
		for _, s := range res.Systems {
			ran[strings.Split(s.System, "@")[0]] = s
		}
		for _, w := range c.want {
			s, ok := ran[w]
			if !ok {
				if w == "sluice_global_redis_least" && !haveRedis {
					continue
				}
				t.Errorf("R=%d: system %s did not run (ran: %v, skipped: %+v)", c.replicas, w, sortedKeys(ran), res.Skipped)
				continue
			}
			if s.Lost != 0 || s.Requests == 0 || s.OK == 0 {
				t.Errorf("R=%d %s: %d requests, %d ok, %d lost, errors %v", c.replicas, w, s.Requests, s.OK, s.Lost, s.Errors)
			}
			sum := 0
			for _, n := range s.PerReplica {
				sum += n
			}
			if sum != s.OK || len(s.PerReplica) != c.replicas {
				t.Errorf("R=%d %s: per replica %v adds up to %d, %d answered", c.replicas, w, s.PerReplica, sum, s.OK)
			}
			if s.Extra["out_tok_s"] <= 0 || s.Extra["ttft_p50_s"] <= 0 || s.Extra["itl_p50_s"] <= 0 {
				t.Errorf("R=%d %s: no streamed tokens counted: %v", c.replicas, w, s.Extra)
			}
			if _, ok := s.Extra["prefix_reuse"]; !ok {
				t.Errorf("R=%d %s: no prefix reuse from the replicas' metrics", c.replicas, w)
			}
		}
		for _, ext := range []string{".md", ".csv", ".json", ".svg"} {
			name := filepath.Join(out, fmt.Sprintf("real-engine-sim-r%d.quick%s", c.replicas, ext))
			if st, err := os.Stat(name); err != nil || st.Size() == 0 {
				t.Errorf("missing output %s: %v", name, err)
			}
		}
	}
}

// TestQuickLLMDEngine runs real-engine -engine llmd -quick end to end: one
// llm-d-inference-sim engine (issue 19's batching engine, fresh for every
// system) behind direct, Caddy round_robin, least_conn, the header oracle
// and every Sluice policy with its defaults (global_redis_least needs
// redis-server: skipped without it, failed under CI=true). It asserts
// only what is not timing: a clean run (nothing lost, every process
// stopped), every system answered every request with max_tokens streamed
// tokens, the engine's own count of requests served adds up to the
// answers, its running/waiting gauges were read, and the report has the
// ratio-to-direct appendix with a row per system. The engine comes from
// SLUICE_LLMD_SIM or scripts/llmd-sim.sh; without it the test is skipped
// (failed under CI=true).
func TestQuickLLMDEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	if _, err := LLMDSimBinary(ctx); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	haveRedis := haveTool(t, "redis-server", "redis-server")
	if !haveRedis && os.Getenv("CI") == "true" {
		t.Fatal("redis-server is missing and could not be installed (apt-get install -y redis-server, as root)")
	}
	bin := caddyForTests(ctx, t)
	out := t.TempDir()
	res, err := Run(ctx, Options{Scenario: "real-engine", Quick: true, OutDir: out, CaddyBin: bin, NoInstall: true,
		Command: "go test ./bench/", Log: testLog{t}, Engine: EngineOptions{Engine: "llmd"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Errorf("run not clean: %v", err)
	}
	e, _ := EngineOptions{Engine: "llmd"}.resolve(false, true)
	ran := map[string]Summary{}
	for _, s := range res.Systems {
		ran[strings.Split(s.System, "@")[0]] = s
	}
	want := []string{"direct", "caddy_round_robin", "caddy_least_conn", "oracle_header_hash", "sluice_queued_least_latency",
		"sluice_load_aware", "sluice_cache_aware", "sluice_global_redis_least", "sluice_flow_control"}
	for _, w := range want {
		s, ok := ran[w]
		if !ok {
			if w == "sluice_global_redis_least" && !haveRedis {
				continue
			}
			t.Errorf("system %s did not run (ran: %v, skipped: %+v)", w, sortedKeys(ran), res.Skipped)
			continue
		}
		if s.Lost != 0 || s.Requests == 0 || s.OK != s.Requests {
			t.Errorf("%s: %d requests, %d ok, %d lost, errors %v", w, s.Requests, s.OK, s.Lost, s.Errors)
		}
		sum := 0
		for _, n := range s.PerReplica {
			sum += n
		}
		if sum != s.OK || len(s.PerReplica) != 1 {
			t.Errorf("%s: per replica (the engine's Δ vllm:request_success_total) %v adds up to %d, %d answered", w, s.PerReplica, sum, s.OK)
		}
		if s.Extra["out_tok_s"] <= 0 || s.Extra["ttft_p50_s"] <= 0 || s.Extra["itl_p50_s"] <= 0 || s.Extra["rate"] != e.Rates[0] {
			t.Errorf("%s: no streamed tokens counted: %v", w, s.Extra)
		}
		if _, ok := s.Extra["batch"]; !ok {
			t.Errorf("%s: the engine's vllm:num_requests_running / _waiting were not read: %v", w, s.Notes)
		}
	}
	for _, rec := range res.records {
		if rec.Status == 200 && rec.Tokens != e.MaxTokens {
			t.Errorf("%s seq %d: %d streamed tokens, want max_tokens %d", rec.System, rec.Seq, rec.Tokens, e.MaxTokens)
			break
		}
	}
	for _, ext := range []string{".md", ".csv", ".json", ".svg"} {
		name := filepath.Join(out, "real-engine-llmd-r1.quick"+ext)
		if st, err := os.Stat(name); err != nil || st.Size() == 0 {
			t.Errorf("missing output %s: %v", name, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(out, "real-engine-llmd-r1.quick.md"))
	for _, w := range want[1:] {
		if _, ok := ran[w]; ok && !strings.Contains(string(md), "| "+w+" |") {
			t.Errorf("the ratio-to-direct appendix has no row for %s", w)
		}
	}
	if !strings.Contains(string(md), "# Real engine (llmd, R = 1): 4 shared 1,500-token system prompts, 16 streamed tokens") {
		t.Errorf("the report's title does not name the engine and the workload")
	}
	if !strings.Contains(string(md), "Sluice policies within both bounds") {
		t.Errorf("the report lacks the ratio-to-direct appendix")
	}
}

// TestParseMetricsAndBodies checks the pieces of real-engine that need no
// processes: the Prometheus parser, the prompts (1 word = 4 characters),
// and the calibration table's source figures.
func TestParseMetricsAndBodies(t *testing.T) {
	m, err := parseMetrics(strings.NewReader("# HELP x y\n# TYPE x counter\nvllm:prefix_cache_hits_total{model_name=\"a b\"} 12\n" +
		"vllm:request_success_total{finished_reason=\"length\"} 3\nvllm:request_success_total{finished_reason=\"stop\"} 4\nbare 1.5e3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m["vllm:prefix_cache_hits_total"] != 12 || m["vllm:request_success_total"] != 7 || m["bare"] != 1500 {
		t.Fatalf("%v", m)
	}
	e, err := EngineOptions{}.resolve(false, false)
	if err != nil {
		t.Fatal(err)
	}
	prefixes := enginePrompts(e)
	if len(prefixes) != 4 || len(prefixes[0]) != 4*1500 || prefixes[0] == prefixes[1] {
		t.Fatalf("prefixes: %d, %d chars", len(prefixes), len(prefixes[0]))
	}
	b1, b2 := engineBodies(e, prefixes, 10, 3), engineBodies(e, prefixes, 10, 3)
	if b1[9] != b2[9] || !strings.Contains(b1[0].json, `"stream":true`) || !strings.Contains(b1[0].json, `"max_tokens":32`) {
		t.Fatalf("bodies not reproducible or not streamed: %v", b1[0].json[:80])
	}
	if _, err := (EngineOptions{Engine: "vllm"}).resolve(false, false); err == nil {
		t.Fatal("unknown engine accepted")
	}
	for _, bad := range []EngineOptions{{Engine: "llmd", StreamHeaders: "immediate"}, {StreamHeaders: "soon"}} {
		if _, err := bad.resolve(false, false); err == nil {
			t.Fatalf("-stream-headers %q with -engine %q accepted", bad.StreamHeaders, bad.Engine)
		}
	}
	if _, err := (EngineOptions{StreamHeaders: "immediate"}).resolve(false, false); err != nil {
		t.Fatal(err)
	}
	if e, _ := (EngineOptions{Endpoints: []string{"http://127.0.0.1:9/v1"}}).resolve(true, false); e.Replicas != 1 || e.Scale != 1 || e.Endpoints[0] != "http://127.0.0.1:9" {
		t.Fatalf("%+v", e)
	}
	if len(measuredH100) != 3 || measuredH100[2].rate != 12 {
		t.Fatal("measured table")
	}
}

// Every repetition of a real-engine run draws its own workload, the same
// for every system of that repetition; the first one is the workload
// every earlier run used (its figures stay comparable).
func TestEveryRepetitionDrawsItsOwnWorkload(t *testing.T) {
	if got := workloadSeed(1, 0, 1); got != 1001 {
		t.Fatalf("first repetition's seed %d, want 1001 (the seed of runs before repetitions drew their own)", got)
	}
	seen := map[uint64]string{}
	for rep := 1; rep <= 6; rep++ {
		for ri := range 3 {
			s := workloadSeed(1, ri, rep)
			if prev, ok := seen[s]; ok {
				t.Fatalf("rate %d of repetition %d reuses the workload of %s", ri, rep, prev)
			}
			seen[s] = fmt.Sprintf("rate %d of repetition %d", ri, rep)
		}
	}
	a1, a2 := poisson(16, time.Second, workloadSeed(1, 0, 1)), poisson(16, time.Second, workloadSeed(1, 0, 2))
	if len(a1) > 0 && len(a2) > 0 && a1[0] == a2[0] {
		t.Fatalf("repetitions 1 and 2 arrive alike: %v, %v", a1[0], a2[0])
	}
}

// The pieces of -engine llmd that need no process: its defaults, the
// engine's flags, the ratio-to-direct verdicts and the edge occupancy.
func TestLLMDDefaultsAndRatios(t *testing.T) {
	e, err := EngineOptions{Engine: "llmd"}.resolve(false, false)
	if err != nil {
		t.Fatal(err)
	}
	if e.Replicas != 1 || !slices.Equal(e.Rates, []float64{20, 30}) || e.Scale != 1 || e.MaxTokens != 16 || e.Model != "m" {
		t.Fatalf("llmd defaults: %+v", e)
	}
	if sim, _ := (EngineOptions{}).resolve(false, false); sim.Replicas != 4 || sim.MaxTokens != 32 || sim.Scale != 0.25 {
		t.Fatalf("sim defaults changed: %+v", sim)
	}
	args := strings.Join(llmdArgs(EngineOptions{PromptWords: 1500, UniqueWords: 40, MaxTokens: 16, ServerArgs: []string{"--seed", "9"}}), " ")
	for _, w := range []string{"--max-num-seqs 16", "--time-factor-under-load 3", "--time-to-first-token 100ms",
		"--inter-token-latency 10ms", "--max-model-len 4096"} {
		if !strings.Contains(args, w) {
			t.Errorf("llmd args %q lack %q", args, w)
		}
	}
	if thousands(1500) != "1,500" || thousands(40) != "40" || thousands(1234567) != "1,234,567" {
		t.Errorf("thousands: %s %s %s", thousands(1500), thousands(40), thousands(1234567))
	}
	if !strings.HasSuffix(args, "--seed 9") {
		t.Errorf("-server-args must come last (the last flag wins): %q", args)
	}
	sum := func(name string, rep int, rate, ttft, tok float64) Summary {
		return Summary{System: fmt.Sprintf("%s@%grps", name, rate), Rep: rep, Requests: 10, OK: 10,
			Extra: map[string]float64{"rate": rate, "ttft_p50_s": ttft, "out_tok_s": tok}}
	}
	app := directRatios([]Summary{
		sum("direct", 1, 20, 0.4, 300), sum("sluice_a", 1, 20, 0.5, 285), sum("sluice_b", 1, 20, 0.51, 300),
		sum("caddy_round_robin", 1, 20, 0.4, 284),
		sum("direct", 1, 30, 4, 330), sum("sluice_a", 1, 30, 2, 330),
	})
	for _, w := range []string{"| 20/s | 1 | sluice_a | 10/10 | 0.50 s | 1.25× | 285 | 0.95× | pass |",
		"| 20/s | 1 | sluice_b | 10/10 | 0.51 s | 1.27× | 300 | 1.00× | **FAIL** (ttft) |",
		"| 20/s | 1 | caddy_round_robin | 10/10 | 0.40 s | 1.00× | 284 | 0.95× | **FAIL** (tok/s) |",
		"| 30/s | 1 | sluice_a | 10/10 | 2.00 s | 0.50× | 330 | 1.00× | pass |",
		"Sluice policies within both bounds: 2 of 3 rows; failing: sluice_b@20rps #1."} {
		if !strings.Contains(app, w) {
			t.Errorf("appendix lacks %q:\n%s", w, app)
		}
	}
	// Two requests in flight at the client from 0 to 1 s, one of them
	// running in the engine: one held at the edge.
	o := &occupancy{samples: []occSample{{at: 500 * time.Millisecond, running: 1}, {at: 3 * time.Second, running: 5}}}
	s := Summary{Extra: map[string]float64{}}
	o.measure([]Record{{Start: 0, Latency: time.Second}, {Start: 0, Latency: time.Second}}, 2*time.Second, 1, &s)
	if s.Extra["batch"] != 1 || s.Extra["engine_queue"] != 0 || s.Extra["edge_held"] != 1 {
		t.Errorf("occupancy: %v %v", s.Extra, s.Notes)
	}
}

// itl is a request's time between two streamed tokens: what is left of
// its end to end after its first token, over the tokens after the first.
func TestInterTokenLatencyIsTheStepARequestSees(t *testing.T) {
	s := Summary{Extra: map[string]float64{}, Errors: map[string]int{}}
	recs := []Record{
		{Status: 200, TTFT: 100 * time.Millisecond, Latency: 1000 * time.Millisecond, Tokens: 10}, // 100 ms
		{Status: 200, TTFT: 200 * time.Millisecond, Latency: 3200 * time.Millisecond, Tokens: 11}, // 300 ms
		{Status: 200, TTFT: 300 * time.Millisecond, Latency: 2300 * time.Millisecond, Tokens: 11}, // 200 ms
		{Status: 200, TTFT: 300 * time.Millisecond, Latency: 300 * time.Millisecond, Tokens: 1},   // one token: none
		{Status: 500, TTFT: 0, Latency: 9 * time.Second, Tokens: 0, Err: "upstream"},              // failed: none
	}
	engineMeasures(1, time.Minute, nil, nil, nil, recs, &s)
	if got := s.Extra["itl_p50_s"]; got < 0.1999 || got > 0.2001 {
		t.Fatalf("itl p50 %v s, want 0.2 s (the middle of 0.1, 0.2 and 0.3 s)", got)
	}
}

// Output tokens/s counts the tokens over the time they took to come: from
// the first arrival to the last token. A request the client gave up on
// (its end the client's timeout, a minute later) stretched the window to
// its timeout, and a system with one such request read a fraction of the
// tokens/s it delivered.
func TestOutputTokensPerSecondEndsAtTheLastToken(t *testing.T) {
	s := Summary{Extra: map[string]float64{}, Errors: map[string]int{}}
	recs := []Record{
		{Status: 200, Start: 0, TTFT: 100 * time.Millisecond, Latency: time.Second, LastToken: time.Second, Tokens: 10},
		// streamed 5 tokens by 0.9 s after its start, then stalled until
		// the client's timeout
		{Status: 200, Start: 500 * time.Millisecond, TTFT: 200 * time.Millisecond, Latency: time.Minute,
			LastToken: 900 * time.Millisecond, Tokens: 5, Err: "body: context deadline exceeded (Client.Timeout exceeded while reading body)"},
		// no answer at all, after the last token
		{Status: 0, Start: 1200 * time.Millisecond, Latency: time.Minute, Err: "Client.Timeout exceeded while awaiting headers"},
	}
	engineMeasures(1, time.Minute, nil, nil, nil, recs, &s)
	// 15 tokens from 0 s to 1.4 s (the second's last token)
	if got, want := s.Extra["out_tok_s"], 15/1.4; got < want*0.999 || got > want*1.001 {
		t.Fatalf("output tokens/s %.2f, want %.2f (15 tokens over 1.4 s)", got, want)
	}
}
