package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// ---- kv-events -----------------------------------------------------------

// The kv-events scenario (issue 23, part 6): R real llm-d-inference-sim
// engines with small KV caches publish what they store and evict to the
// kv_events address of a Sluice cache_aware; the same shared-prefix
// workload goes through the exact index, the approximate tree, Caddy
// least_conn, Caddy's header hash on the prefix id, 4 Sluice instances
// sharing the tree through Redis, and the planned oracle (kvoracle.go:
// every prefix to a home engine chosen offline knowing each engine's cache
// size and eviction rule and the whole request sequence, routed by Caddy
// on a header the harness sets), at three cache shapes. Hit rate is the
// engines' own (vllm:prefix_cache_hits ÷ vllm:prefix_cache_queries,
// prompt tokens).

// kvBench is the scenario's shape.
type kvBench struct {
	replicas     int
	prefixes     int     // P shared prefixes
	prefixWords  int     // W words (= tokens with the sim's dummy tokenizer) per prefix
	uniqueWords  int     // U words of its own per request
	maxTokens    int     // output tokens per request (ignore_eos)
	blockSize    int     // tokens per KV block
	caches       [][]int // KV cache sizes in blocks, one pass each: one size for all, or one per replica
	rate         float64
	arrivals     time.Duration
	maxNumSeqs   int
	prefillToken time.Duration // per uncached prompt token
	interToken   time.Duration
	seed         uint64
}

func kvBenchShape(quick bool) kvBench {
	k := kvBench{replicas: 4, prefixes: 20, prefixWords: 512, uniqueWords: 32, maxTokens: 8, blockSize: 16,
		rate: 12, arrivals: 40 * time.Second, maxNumSeqs: 4, prefillToken: 500 * time.Microsecond,
		interToken: 10 * time.Millisecond, seed: 23}
	// The prompt set: P × W/16 = 640 blocks of shared prefixes; the four
	// caches together hold less (34 blocks a request with its own). 144
	// blocks each: every replica holds 4.2 of the 5 prefixes it gets when
	// they are spread evenly, so a router that knows where each prefix
	// lives does as well as one that knows what each engine keeps. Mixed
	// sizes (GPUs of several kinds, or engines given different memory):
	// an even spread overfills the small caches while the big ones have
	// room, which only the engines' events show. Every size holds the
	// blocks of max-num-seqs running requests (4 × 34), which the sim
	// requires. (With 16 prefixes, caches of 160 and 144 blocks, every
	// cache_aware variant reaches the ceiling once new prefixes spread
	// evenly.)
	k.caches = [][]int{{144}, {136, 136, 200, 232}, {136, 160, 184, 208}}
	if quick {
		k.arrivals = 4 * time.Second
	}
	return k
}

var kvEventsScenario = scenario{
	name: "kv-events",
	title: "Exact prefix index from engine KV events: 4 llm-d-inference-sim engines with small KV caches, " +
		"20 shared prefixes, uniform and mixed cache sizes, exact vs approximate vs least_conn vs oracle",
	about: "R = 4 llm-d-inference-sim v0.10.2 engines (--enable-kvcache, --block-size 16, --force-dummy-tokenizer: one " +
		"token per word) whose KV cache holds only part of the prompt set; each publishes its KV events (ZMQ, one event " +
		"per batch: --event-batch-size 1, as vLLM publishes every step) to the kv_events address of the system under " +
		"test, where there is one. Workload: P shared prefixes of W words + U words of its own per request (every block " +
		"full), streamed /v1/completions with max_tokens M and ignore_eos, Poisson arrivals, the same bodies and " +
		"times for every system; the engines' time model: --prefill-time-per-token per UNCACHED prompt token " +
		"(v0.10.2 subtracts the cached tokens), --inter-token-latency per output token, --max-num-seqs running at " +
		"once. Fresh engines (empty caches) for every system. hit rate = Δ vllm:prefix_cache_hits ÷ Δ " +
		"vllm:prefix_cache_queries over the engines (prompt tokens served from their own cache; the ceiling is " +
		"W ÷ (W + U) less the first request of every prefix); vs oracle = ÷ the oracle's hit rate at the same cache " +
		"size; ttft = time to the first streamed token; p50/p90/p99 = end to end; per replica = each engine's Δ " +
		"vllm:request_success_total. The oracle knows what no router can: each engine's cache size and eviction rule and the whole " +
		"request sequence; it gives every prefix one home engine, planned offline by local search (moves and swaps of " +
		"prefixes) over a replay of the requests on a model of the sim's block cache, to maximise cached prompt tokens " +
		"with no engine given more than 1.25× the mean requests; the harness names the home in a header and Caddy " +
		"routes on it (reverse_proxy per header match). A reference, not a proven bound: a dynamic router may beat " +
		"the best static plan. header_hash is Caddy's header policy on X-Prefix-Id (prefix-hash routing: hashes the " +
		"prefix id, which only it reads). The x4 rows are 4 Sluice instances through one Redis, the requests spread round-robin " +
		"over them: the tree shared, and for kv_events each engine publishing to one instance only, which relays " +
		"its events to the others; exact replicas = the fewest any instance scores exactly.",
	extras: []extraCol{{"cache_blocks", "cache", "%.0f blk"}, {"hit_rate", "hit rate", "%.3f"}, {"vs_oracle", "vs oracle", "%.3f"},
		{"ttft_p50_s", "ttft p50", "%.3f s"}, {"ttft_p90_s", "ttft p90", "%.3f s"}, {"ttft_p99_s", "ttft p99", "%.3f s"},
		{"exact_replicas", "exact replicas", "%.0f"}},
	run: kvEvents,
}

// LLMDSimBinary returns the llm-d-inference-sim binary: $SLUICE_LLMD_SIM,
// else the one scripts/llmd-sim.sh builds (once, cached) and names. The
// error says why there is none.
func LLMDSimBinary(ctx context.Context) (string, error) {
	if bin := os.Getenv("SLUICE_LLMD_SIM"); bin != "" {
		if st, err := os.Stat(bin); err != nil || st.IsDir() {
			return "", fmt.Errorf("SLUICE_LLMD_SIM=%s is not a file (build it: export SLUICE_LLMD_SIM=\"$(bash scripts/llmd-sim.sh)\")", bin)
		}
		return bin, nil
	}
	cands := []string{filepath.Join("scripts", "llmd-sim.sh"), filepath.Join("..", "scripts", "llmd-sim.sh")}
	if _, file, _, ok := runtime.Caller(0); ok {
		cands = append(cands, filepath.Join(filepath.Dir(file), "..", "scripts", "llmd-sim.sh"))
	}
	script := ""
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			script = c
			break
		}
	}
	if script == "" {
		return "", errors.New("llm-d-inference-sim not found: SLUICE_LLMD_SIM is not set and scripts/llmd-sim.sh is not here (run from the repository root)")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("llm-d-inference-sim could not be built (bash %s): %v %s", script, err, lastLine(stderr.String()))
	}
	bin := strings.TrimSpace(string(out))
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		return "", fmt.Errorf("bash %s named %q, not a file", script, bin)
	}
	return bin, nil
}

// kvPrompts returns the P shared prefixes: W words each, every word
// followed by one space (one dummy token per word).
func kvPrompts(k kvBench) []string { return sharedPrompts(k.seed, k.prefixes, k.prefixWords) }

// kvBodies returns n request bodies: a prefix drawn uniformly and U words
// of its own.
func kvBodies(k kvBench, prefixes []string, n int) []engineBody {
	words := engineWords()
	rng := rand.New(rand.NewPCG(k.seed, 0x6b76))
	out := make([]engineBody, n)
	for i := range out {
		id := rng.IntN(len(prefixes))
		var b strings.Builder
		b.WriteString(prefixes[id])
		for j := range k.uniqueWords {
			if j > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[rng.IntN(len(words))])
		}
		j, _ := json.Marshal(map[string]any{"model": "m", "prompt": b.String(), "max_tokens": k.maxTokens,
			"stream": true, "ignore_eos": true, "temperature": 0})
		out[i] = engineBody{id, string(j)}
	}
	return out
}

// kvFleet is one system's engines: their ports and the ZMQ addresses
// they publish to, one per proxy (engine i publishes to proxy i mod the
// proxies, as engines each publish to one address).
type kvFleet struct {
	ports []int
	zmqs  []string
}

func (f kvFleet) urls() []string {
	out := make([]string, len(f.ports))
	for i, p := range f.ports {
		out[i] = fmt.Sprintf("http://127.0.0.1:%d", p)
	}
	return out
}

func (f kvFleet) addrs() []string {
	out := make([]string, len(f.ports))
	for i, p := range f.ports {
		out[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return out
}

// zmqOf is the address engine i publishes to.
func (f kvFleet) zmqOf(i int) string { return f.zmqs[i%len(f.zmqs)] }

func newKVFleet(n, proxies int) (kvFleet, error) {
	ports, err := freePorts(n + proxies)
	if err != nil {
		return kvFleet{}, err
	}
	f := kvFleet{ports: ports[:n]}
	for _, p := range ports[n:] {
		f.zmqs = append(f.zmqs, fmt.Sprintf("tcp://127.0.0.1:%d", p))
	}
	return f, nil
}

// startLLMDSims starts one llm-d-inference-sim per port on loopback
// (system processes: stopped by PID when the system ends) and waits until
// each answers /health; it returns their base URLs. Every engine gets the
// flags every use shares — model "m", random answers, seed i+1, the dummy
// tokenizer (offline: one token per word), POD_IP = its own address, as
// the engine names itself in its KV events — then args(i).
func (r *runner) startLLMDSims(bin string, ports []int, args func(i int) []string) ([]string, error) {
	var started []*proc
	var out []string
	for i, port := range ports {
		pod := fmt.Sprintf("127.0.0.1:%d", port)
		a := append([]string{"--model", "m", "--port", strconv.Itoa(port), "--mode", "random", "--seed", strconv.Itoa(i + 1),
			"--force-dummy-tokenizer"}, args(i)...)
		p, err := r.procs.start(fmt.Sprintf("llmd-sim-%d", port), []string{"POD_IP=" + pod}, bin, a...)
		if err != nil {
			return nil, err
		}
		started = append(started, p)
		out = append(out, "http://"+pod)
	}
	for i, p := range started {
		if err := waitHealthy(r.ctx, p, out[i], 30*time.Second); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// kvHealthOf reads the kv_events part of a proxy's /_custom_router/health
// (nil without one).
func kvHealthOf(ctx context.Context, proxy string) (*kvHealthReport, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, proxy+"/_custom_router/health", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var h struct {
		Settings map[string]map[string]json.RawMessage `json:"settings"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&h); err != nil {
		return nil, err
	}
	raw := h.Settings["cache_aware"]["kv_events"]
	if raw == nil {
		return nil, nil
	}
	var kv kvHealthReport
	if err := json.Unmarshal(raw, &kv); err != nil {
		return nil, err
	}
	return &kv, nil
}

// kvHealthReport is what the harness reads of the kv_events health.
type kvHealthReport struct {
	Replicas map[string]struct {
		Mode   string `json:"mode"`
		Blocks int    `json:"blocks"`
	} `json:"replicas"`
	Totals     map[string]uint64 `json:"totals"`
	Drops      map[string]uint64 `json:"drops"`
	EventDrops map[string]uint64 `json:"event_drops"`
}

func (h *kvHealthReport) note() string {
	var reps []string
	for _, name := range sortedKeys(h.Replicas) {
		rp := h.Replicas[name]
		reps = append(reps, fmt.Sprintf("%s %s %d blocks", name, rp.Mode, rp.Blocks))
	}
	var tot []string
	for _, k := range []string{"batches", "events", "gaps", "restarts", "cleared", "removed_unknown", "capacity_evicted", "re_stored"} {
		tot = append(tot, fmt.Sprintf("%s %d", k, h.Totals[k]))
	}
	list := func(m map[string]uint64) string {
		if len(m) == 0 {
			return "none"
		}
		var d []string
		for _, k := range sortedKeys(m) {
			d = append(d, fmt.Sprintf("%s %d", k, m[k]))
		}
		return strings.Join(d, ", ")
	}
	return fmt.Sprintf("kv_events index at the end: %s; %s; messages dropped: %s; events dropped: %s",
		strings.Join(reps, ", "), strings.Join(tot, ", "), list(h.Drops), list(h.EventDrops))
}

// kvMetricsPath is where the Sluice proxies of kv-events serve Caddy's
// metrics (/metrics goes through to the engines).
const kvMetricsPath = "/_sluice/metrics"

// cacheAwareDecisions sums the cache_aware decision counters over the
// proxies ("" when they have none): which rule placed the requests.
func cacheAwareDecisions(ctx context.Context, proxies []string) string {
	sum := map[string]float64{}
	for _, u := range proxies {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+kvMetricsPath, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			continue
		}
		sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			name := ""
			switch {
			case strings.HasPrefix(line, "sluice_cache_aware_decisions_total{"):
				if i := strings.Index(line, `reason="`); i >= 0 {
					name = line[i+8:]
					name = name[:strings.IndexByte(name, '"')]
				}
			case strings.HasPrefix(line, "sluice_cache_aware_exact_hits_total{"):
				name = "exact"
			case strings.HasPrefix(line, "sluice_cache_aware_affinity_hits_total{"):
				name = "affinity"
			case strings.HasPrefix(line, "sluice_cache_aware_moves_total{"):
				name = "moved"
			}
			if f := strings.Fields(line); name != "" && len(f) == 2 {
				v, _ := strconv.ParseFloat(f[1], 64)
				sum[name] += v
			}
		}
		resp.Body.Close()
		cancel()
	}
	if len(sum) == 0 {
		return ""
	}
	var parts []string
	for _, k := range []string{"cache_hit", "exact", "affinity", "moved", "miss", "imbalance"} {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, sum[k]))
	}
	return "cache_aware decisions (all proxies): " + strings.Join(parts, ", ")
}

func kvEvents(r *runner) {
	k := kvBenchShape(r.opt.Quick)
	bin, binErr := LLMDSimBinary(r.ctx)
	if r.rep == 1 {
		r.res.About = fmt.Sprintf("%s Here: R = %d, P = %d, W = %d, U = %d, M = %d, block %d tokens, caches %v blocks "+
			"(the prompt set: %d blocks of prefixes), --max-num-seqs %d, --prefill-time-per-token %v, "+
			"--inter-token-latency %v, Poisson %g req/s for %v.", r.res.About, k.replicas, k.prefixes, k.prefixWords,
			k.uniqueWords, k.maxTokens, k.blockSize, k.caches, k.prefixes*k.prefixWords/k.blockSize, k.maxNumSeqs,
			k.prefillToken, k.interToken, k.rate, k.arrivals)
	}
	prefixes := kvPrompts(k)
	arrivals := poisson(k.rate, k.arrivals, k.seed)
	bodies := kvBodies(k, prefixes, len(arrivals))
	timeout := 60 * time.Second

	for ci, sizes := range k.caches {
		at := "@" + cacheLabel(sizes)
		cacheOf := func(i int) int { return sizes[min(i, len(sizes)-1)] }
		mean := 0.0
		for i := range k.replicas {
			mean += float64(cacheOf(i)) / float64(k.replicas)
		}
		oracleHit := 0.0
		// mk builds one system: fresh engines, then proxies(fleet). home,
		// if not nil, is the oracle's engine per prefix, sent with every
		// request as X-Oracle-Home.
		mk := func(name, desc string, nProxies int, home []int, proxies func(f kvFleet) ([]string, error)) sysSpec {
			var fleet kvFleet
			var before []map[string]float64
			var proxyURLs []string
			return sysSpec{name: name + at, desc: desc, proxies: nProxies, reqTimeout: timeout,
				start: func([]*sim.Server) ([]string, error) {
					if binErr != nil {
						return nil, fmt.Errorf("%w: %v", errSkipped, binErr)
					}
					var err error
					if fleet, err = newKVFleet(k.replicas, nProxies); err != nil {
						return nil, err
					}
					// The proxy first: with kv_events it binds the address the
					// engines dial (a PUB drops what it sends before that).
					if proxyURLs, err = proxies(fleet); err != nil {
						return nil, err
					}
					if _, err := r.startLLMDSims(bin, fleet.ports, func(i int) []string {
						return []string{"--enable-kvcache",
							"--kv-cache-size", strconv.Itoa(cacheOf(i)), "--block-size", strconv.Itoa(k.blockSize),
							"--event-batch-size", "1", "--zmq-endpoint", fleet.zmqOf(i),
							"--prefill-time-per-token", k.prefillToken.String(), "--inter-token-latency", k.interToken.String(),
							"--max-num-seqs", strconv.Itoa(k.maxNumSeqs), "--max-model-len", "4096"}
					}); err != nil {
						return nil, err
					}
					return proxyURLs, nil
				},
				load: func(_ []*sim.Server, pr []string) workload {
					before = scrapeReplicas(r.ctx, fleet.urls())
					return workload{arrivals: arrivals, sse: true, build: func(n int) (*http.Request, int) {
						p := n % len(pr)
						req, _ := http.NewRequest(http.MethodPost, pr[p]+"/v1/completions", strings.NewReader(bodies[n].json))
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("X-Prefix-Id", strconv.Itoa(bodies[n].prefix))
						if home != nil {
							req.Header.Set("X-Oracle-Home", strconv.Itoa(home[bodies[n].prefix]))
						}
						return req, p
					}}
				},
				after: func(_ []*sim.Server, recs []Record, s *Summary) {
					// The engines count a request's prefix-cache stats through a
					// channel: let the last ones land.
					time.Sleep(300 * time.Millisecond)
					engineMeasures(k.rate, timeout, fleet.urls(), before, scrapeReplicas(r.ctx, fleet.urls()), recs, s)
					s.Extra["cache_blocks"] = mean
					if v, ok := s.Extra["prefix_reuse"]; ok {
						s.Extra["hit_rate"] = v
						delete(s.Extra, "prefix_reuse")
						if strings.HasPrefix(s.System, "oracle") {
							oracleHit = v
						}
						if oracleHit > 0 {
							s.Extra["vs_oracle"] = v / oracleHit
						}
					}
					delete(s.Extra, "rate")
					if d := cacheAwareDecisions(r.ctx, proxyURLs); d != "" {
						s.Notes = append(s.Notes, d)
					}
					for _, u := range proxyURLs {
						h, herr := kvHealthOf(r.ctx, u)
						if herr != nil || h == nil {
							continue
						}
						n := 0
						for _, rp := range h.Replicas {
							if rp.Mode == "exact" {
								n++
							}
						}
						// several proxies: the fewest any of them scores exactly
						if v, ok := s.Extra["exact_replicas"]; !ok || float64(n) < v {
							s.Extra["exact_replicas"] = float64(n)
						}
						s.Notes = append(s.Notes, h.note())
					}
				}}
		}
		custom := func(f kvFleet, pool, policy string) string {
			return fmt.Sprintf("custom_router %s {\n\tbackends %s\n}\nmetrics %s\nreverse_proxy {\n\tdynamic custom_router %s\n\t%s\n}",
				pool, strings.Join(f.urls(), " "), kvMetricsPath, pool, strings.ReplaceAll(policy, "\n", "\n\t"))
		}
		pool := fmt.Sprintf("kvb%d", ci)
		keyPrefix := fmt.Sprintf("bench-kv-%d-%d", ci, time.Now().UnixNano()%1e9)
		var systems []sysSpec
		if selected("oracle_planned"+at, r.opt.Only) { // the plan takes seconds of CPU
			home, replay, blind := kvOracleFor(k, sizes, arrivals, bodies)
			systems = append(systems, mk("oracle_planned", fmt.Sprintf("oracle: every prefix sent to its home engine, planned offline "+
				"from the engines' cache sizes and eviction rule and the whole request sequence (engine per prefix %v; the plan "+
				"replayed on a model of the engines: hit rate %.3f, requests per engine %v; a plan made the same way from another "+
				"draw of the workload, replayed on this one: %.3f); the harness names the home in X-Oracle-Home and Caddy routes "+
				"on that header", home, replay.rate(), replay.perEngine, blind.rate()), 1, home,
				func(f kvFleet) ([]string, error) {
					return r.caddyProxies("oracle", 1, func(int) string { return oracleProxy(f.addrs()) })
				}))
		}
		systems = append(systems, []sysSpec{
			mk("header_hash", "Caddy lb_policy header X-Prefix-Id (hashes the prefix id, which only it sees: prefix-hash routing)", 1, nil,
				func(f kvFleet) ([]string, error) {
					return r.caddyProxies("header-hash", 1, func(int) string { return staticProxy(f.addrs(), "lb_policy header X-Prefix-Id") })
				}),
			mk("sluice_cache_aware_kv_events", "Sluice cache_aware with kv_events + kv_events_tokenizer llmd_sim (the exact index), defaults otherwise", 1, nil,
				func(f kvFleet) ([]string, error) {
					return r.caddyProxies("sluice-kv", 1, func(int) string {
						return custom(f, pool, fmt.Sprintf("lb_policy cache_aware {\n\tpool %s\n\tkv_events %s\n\tkv_events_tokenizer llmd_sim\n}", pool, f.zmqs[0]))
					})
				}),
			mk("sluice_cache_aware_tree", "Sluice cache_aware without kv_events (the approximate tree), defaults", 1, nil,
				func(f kvFleet) ([]string, error) {
					return r.caddyProxies("sluice-tree", 1, func(int) string {
						return custom(f, pool, fmt.Sprintf("lb_policy cache_aware {\n\tpool %s\n}", pool))
					})
				}),
			mk("caddy_least_conn", "Caddy lb_policy least_conn", 1, nil,
				func(f kvFleet) ([]string, error) {
					return r.caddyProxies("caddy-lc", 1, func(int) string { return staticProxy(f.addrs(), "lb_policy least_conn") })
				}),
			mk("sluice_cache_aware_tree_redis_x4", "4 Sluice, cache_aware without kv_events, the trees shared through one Redis; load spread round-robin over the 4", 4, nil,
				func(f kvFleet) ([]string, error) {
					addr, err := r.redisAddr()
					if err != nil {
						return nil, fmt.Errorf("%w: %v", errSkipped, err)
					}
					return r.caddyProxies("sluice-tree-x4", 4, func(int) string {
						return custom(f, pool, fmt.Sprintf("lb_policy cache_aware {\n\tpool %s\n\tredis %s\n\tkey_prefix %s\n}", pool, addr, keyPrefix))
					})
				}),
			mk("sluice_cache_aware_kv_events_redis_x4", "4 Sluice, cache_aware with kv_events (engine i publishes to Sluice i only) "+
				"and redis: events relayed and trees shared through one Redis; load spread round-robin over the 4", 4, nil,
				func(f kvFleet) ([]string, error) {
					addr, err := r.redisAddr()
					if err != nil {
						return nil, fmt.Errorf("%w: %v", errSkipped, err)
					}
					return r.caddyProxies("sluice-kv-x4", 4, func(i int) string {
						return custom(f, pool, fmt.Sprintf("lb_policy cache_aware {\n\tpool %s\n\tredis %s\n\tkey_prefix %s-kv\n"+
							"\tkv_events %s\n\tkv_events_tokenizer llmd_sim\n}", pool, addr, keyPrefix, f.zmqs[i]))
					})
				}),
		}...)
		if r.opt.Quick { // quick mode's cost stays that of six systems: the oracle is the reference kept
			systems = slices.DeleteFunc(systems, func(s sysSpec) bool { return strings.HasPrefix(s.name, "header_hash@") })
		}
		for _, s := range systems {
			r.system(s)
		}
	}
	if r.rep == r.res.Reps {
		r.res.appendix = kvAppendix(r.res.Systems)
	}
}

// cacheLabel names a pass's caches: "144blk", or "136+136+200+232blk" for
// one size per replica.
func cacheLabel(sizes []int) string {
	parts := make([]string, len(sizes))
	for i, n := range sizes {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, "+") + "blk"
}

// kvAppendix is the must-show comparison: per cache size and rep, the
// exact index against the tree and the oracle.
func kvAppendix(systems []Summary) string {
	type key struct {
		cache string // the pass's label (cacheLabel)
		rep   int
	}
	by := map[key]map[string]Summary{}
	var keys []key
	for _, s := range systems {
		name, cache, _ := strings.Cut(s.System, "@")
		kk := key{cache, s.Rep}
		if by[kk] == nil {
			by[kk] = map[string]Summary{}
			keys = append(keys, kk)
		}
		by[kk][name] = s
	}
	sort.SliceStable(keys, func(i, j int) bool { return keys[i].rep < keys[j].rep }) // passes in run order
	var rows [][]string
	for _, kk := range keys {
		m := by[kk]
		ex, okE := m["sluice_cache_aware_kv_events"]
		tr, okT := m["sluice_cache_aware_tree"]
		or, okO := m["oracle_planned"]
		if !okE || !okT {
			continue
		}
		f := func(v float64) string { return fmt.Sprintf("%.3f", v) }
		ratio := func(a, b float64) string {
			if b == 0 {
				return "—"
			}
			return fmt.Sprintf("%.2f×", a/b)
		}
		oh, eo := "—", "—"
		if okO {
			oh, eo = f(or.Extra["hit_rate"]), fmt.Sprintf("%.3f", ex.Extra["hit_rate"]/or.Extra["hit_rate"])
		}
		x4, x4d := "—", "—"
		if e4, ok := m["sluice_cache_aware_kv_events_redis_x4"]; ok {
			x4, x4d = f(e4.Extra["hit_rate"]), fmt.Sprintf("%+.3f", e4.Extra["hit_rate"]-ex.Extra["hit_rate"])
		}
		rows = append(rows, []string{strings.ReplaceAll(strings.TrimSuffix(kk.cache, "blk"), "+", " + ") + " blocks", strconv.Itoa(max(kk.rep, 1)),
			f(ex.Extra["hit_rate"]), f(tr.Extra["hit_rate"]), oh, eo,
			fmt.Sprintf("%+.3f", ex.Extra["hit_rate"]-tr.Extra["hit_rate"]),
			ratio(ex.Extra["ttft_p50_s"], tr.Extra["ttft_p50_s"]), ratio(ex.Extra["ttft_p90_s"], tr.Extra["ttft_p90_s"]),
			x4, x4d})
	}
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("Exact (kv_events) against the approximate tree and the planned oracle, per cache size (TTFT ratio < 1: exact faster), " +
		"and exact through 4 instances relaying the events against one instance:\n\n")
	mdTable(&b, []string{"cache", "rep", "hit rate exact", "hit rate tree", "hit rate oracle", "exact ÷ oracle", "exact − tree",
		"ttft p50 exact ÷ tree", "ttft p90 exact ÷ tree", "hit rate exact ×4", "×4 − one"}, rows)
	return b.String()
}
