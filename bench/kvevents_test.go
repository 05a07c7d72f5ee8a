package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQuickKVEvents runs kv-events -quick end to end: for each of the two
// cache sizes, 4 real llm-d-inference-sim engines publishing KV events,
// behind the oracle, cache_aware with kv_events, cache_aware with the
// tree, Caddy least_conn and 4 instances sharing the tree (and, with
// kv_events, relaying the events) through Redis.
// It asserts what is not timing: a clean run (nothing lost, every process
// stopped), every system answered, the engines' hit rate and per-replica
// counts were read (the counts add up to the answers), and the kv_events
// system's index saw its engines. The engine comes from SLUICE_LLMD_SIM
// or scripts/llmd-sim.sh; without it the test is skipped (failed under
// CI=true, where scripts/test.sh builds it).
func TestQuickKVEvents(t *testing.T) {
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
	res, err := Run(ctx, Options{Scenario: "kv-events", Quick: true, OutDir: out, CaddyBin: bin, NoInstall: true,
		Command: "go test ./bench/", Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Errorf("run not clean: %v", err)
	}
	ran := map[string]Summary{}
	for _, s := range res.Systems {
		ran[s.System] = s
	}
	k := kvBenchShape(true)
	for _, cache := range k.caches {
		want := []string{"oracle_planned", "sluice_cache_aware_kv_events", "sluice_cache_aware_tree",
			"caddy_least_conn", "sluice_cache_aware_tree_redis_x4", "sluice_cache_aware_kv_events_redis_x4"}
		for _, w := range want {
			name := w + "@" + cacheLabel(cache)
			s, ok := ran[name]
			if !ok {
				if strings.HasSuffix(w, "_redis_x4") && !haveRedis {
					continue
				}
				t.Errorf("system %s did not run (ran: %v, skipped: %+v)", name, sortedKeys(ran), res.Skipped)
				continue
			}
			if s.Lost != 0 || s.Requests == 0 || s.OK != s.Requests {
				t.Errorf("%s: %d requests, %d ok, %d lost, errors %v", name, s.Requests, s.OK, s.Lost, s.Errors)
			}
			if _, ok := s.Extra["hit_rate"]; !ok {
				t.Errorf("%s: no hit rate from the engines' metrics: %v %v", name, s.Extra, s.Notes)
			}
			if s.Extra["cache_blocks"] < float64(slices.Min(cache)) || s.Extra["cache_blocks"] > float64(slices.Max(cache)) || s.Extra["ttft_p50_s"] <= 0 {
				t.Errorf("%s: extras %v", name, s.Extra)
			}
			sum := 0
			for _, n := range s.PerReplica {
				sum += n
			}
			if sum != s.OK || len(s.PerReplica) != k.replicas {
				t.Errorf("%s: per replica %v adds up to %d, %d answered", name, s.PerReplica, sum, s.OK)
			}
			if w == "oracle_planned" {
				// every request went to its prefix's planned home
				prefixes := kvPrompts(k)
				arrivals := poisson(k.rate, k.arrivals, k.seed)
				_, plan, _ := kvOracleFor(k, cache, arrivals, kvBodies(k, prefixes, len(arrivals)))
				var got []int
				for _, n := range s.PerReplica {
					got = append(got, n)
				}
				want := append([]int(nil), plan.perEngine...)
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("%s: requests per engine %v, the plan's %v", name, s.PerReplica, plan.perEngine)
				}
			}
			if strings.HasPrefix(w, "sluice_cache_aware_kv_events") && s.Extra["exact_replicas"] < 1 {
				t.Errorf("%s: the index saw no engine's events: %v", name, s.Notes)
			}
		}
	}
	for _, ext := range []string{".md", ".csv", ".json", ".svg"} {
		name := filepath.Join(out, "kv-events.quick"+ext)
		if st, err := os.Stat(name); err != nil || st.Size() == 0 {
			t.Errorf("missing output %s: %v", name, err)
		}
	}
	if md, _ := os.ReadFile(filepath.Join(out, "kv-events.quick.md")); !strings.Contains(string(md), "hit rate exact") {
		t.Errorf("the report lacks the exact-vs-tree table")
	}
}

// The pieces of kv-events that need no process: the workload is the same
// for every system, every word is one token with every block full, and
// both cache sizes hold the running requests' blocks (the engine refuses a
// request otherwise) while holding less than the prompt set.
func TestKVEventsShape(t *testing.T) {
	k := kvBenchShape(false)
	prefixes := kvPrompts(k)
	if len(prefixes) != k.prefixes || len(strings.Fields(prefixes[0])) != k.prefixWords || prefixes[0] == prefixes[1] {
		t.Fatalf("prefixes: %d, %d words", len(prefixes), len(strings.Fields(prefixes[0])))
	}
	a, b := kvBodies(k, prefixes, 50), kvBodies(k, prefixes, 50)
	seen := map[int]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("bodies not reproducible")
		}
		seen[a[i].prefix] = true
	}
	if len(seen) < k.prefixes/2 || !strings.Contains(a[0].json, `"stream":true`) || !strings.Contains(a[0].json, `"ignore_eos":true`) {
		t.Fatalf("bodies: %d prefixes used, %s…", len(seen), a[0].json[:60])
	}
	if (k.prefixWords+k.uniqueWords)%k.blockSize != 0 || k.prefixWords%k.blockSize != 0 {
		t.Fatal("blocks not full")
	}
	set := k.prefixes * k.prefixWords / k.blockSize
	perReq := (k.prefixWords + k.uniqueWords) / k.blockSize
	for _, sizes := range k.caches {
		for _, c := range sizes {
			if c < k.maxNumSeqs*perReq || c >= set {
				t.Errorf("cache %d blocks: must hold %d running requests' %d blocks and less than the prompt set's %d", c, k.maxNumSeqs, k.maxNumSeqs*perReq, set)
			}
		}
	}
	app := kvAppendix([]Summary{
		{System: "oracle_planned@256blk", Rep: 1, Extra: map[string]float64{"cache_blocks": 256, "hit_rate": 0.8}},
		{System: "sluice_cache_aware_kv_events@256blk", Rep: 1, Extra: map[string]float64{"cache_blocks": 256, "hit_rate": 0.78, "ttft_p50_s": 1, "ttft_p90_s": 2}},
		{System: "sluice_cache_aware_tree@256blk", Rep: 1, Extra: map[string]float64{"cache_blocks": 256, "hit_rate": 0.7, "ttft_p50_s": 2, "ttft_p90_s": 2}},
	})
	if !strings.Contains(app, "| 256 blocks | 1 | 0.780 | 0.700 | 0.800 | 0.975 | +0.080 | 0.50× | 1.00× | — | — |") {
		t.Errorf("appendix:\n%s", app)
	}
}
