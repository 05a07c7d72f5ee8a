package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
			if s.Extra["out_tok_s"] <= 0 || s.Extra["ttft_p50_s"] <= 0 {
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
	if e, _ := (EngineOptions{Endpoints: []string{"http://127.0.0.1:9/v1"}}).resolve(true, false); e.Replicas != 1 || e.Scale != 1 || e.Endpoints[0] != "http://127.0.0.1:9" {
		t.Fatalf("%+v", e)
	}
	if len(measuredH100) != 3 || measuredH100[2].rate != 12 {
		t.Fatal("measured table")
	}
}
