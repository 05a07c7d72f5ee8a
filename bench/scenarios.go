package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-router/sluice/sim"
)

var scenarios = []scenario{
	{
		name:  "chaos",
		title: "Chaos: every Sluice policy under cancels, replica kills, set-backends churn, hot reloads and Redis outages",
		about: "4 replicas (4 sequences, ~15 ms lognormal); 250 req/s, 10,000 requests per system (1,500 with -quick), a third " +
			"streamed; 10% of the clients give up after 1–60 ms (mid-queue or mid-stream); the backend set changes every second, " +
			"a hot reload lands every 2.5 s (good and refused in turn), a replica is killed every 3 s and back 1 s later, and for " +
			"the Redis systems: Redis is frozen for 1.5 s, killed and restarted empty, restarted from a snapshot a tenth of the run " +
			"old, then fails over to a replica that lagged 2 s (promoted, the address moved to it); every other good reload " +
			"changes a connection setting, the instances of a pool get different backend sets, and every other refused reload " +
			"gives the pool a second site with its own upstreams. After the drain every counter Sluice keeps must be 0 (a flow " +
			"gate record whose lease has lapsed holds nothing: the next claim reaps it). lost: requests not given up that got no answer; leaked: counters not back to 0; panics: " +
			"panic lines in the proxies' logs; cancelled: requests their client gave up.",
		extras: []extraCol{{"cancelled", "cancelled", "%.0f"}, {"leaked", "leaked", "%.0f"}, {"panics", "panics", "%.0f"}},
		run:    chaos,
	},
	{
		name:  "local-view",
		title: "Photoroom local view: 4 proxies × 16 one-at-a-time replicas at 85% load",
		about: "16 one-at-a-time replicas (~100 ms lognormal, σ 0.5; capacity ~160 req/s), " +
			"Poisson arrivals at 136 req/s (85%) spread round-robin over the proxies. " +
			"Per-proxy policies see only their own quarter of the traffic; global_redis_least shares one view " +
			"through a private Redis; the references are one central queue (one HAProxy with maxconn 1 per server, " +
			"one Sluice queued_least_latency with a 1 ms threshold).",
		run: localView,
	},
	{
		name:  "local-view-prefix",
		title: "Local view, shared prefixes: 4 proxies × cache_aware over 4 prefix-caching replicas, 12 prefixes",
		about: "12 system prompts of ~520 tokens shared by many chats; 4 replicas with a prefix cache of 30 blocks of 256 " +
			"characters (about 3 prefixes each, so the fleet holds all 12 only if each prefix stays on one replica), " +
			"0.4 ms prefill per uncached token, 5 ms per output token, 8 sequences at once; Poisson 40 req/s spread " +
			"round-robin over the proxies. cache_aware with one tree per instance, with the trees shared through a private " +
			"Redis (redis option), and through one instance; least_conn and HAProxy leastconn ×4 as the local-view peers. " +
			"hit rate = Σ PrefixHits / Σ PrefixQueries over the replicas (prompt tokens).",
		extras: []extraCol{{"hit_rate", "hit rate", "%.2f"}},
		run:    localViewPrefix,
	},
	{
		name:  "quickstart-mixed",
		title: "Quick start, mixed traffic: one stream, one completion, then a burst of 40 completions",
		about: "Caddyfile.example's fleet: 4 one-at-a-time replicas, three of ~200 ms and one of ~400 ms (lognormal σ 0.3). " +
			"One streamed chat request at 0, one plain completion at 0.7 s, a burst of 40 plain completions at 1.5 s. " +
			"burst_s: from the burst to its last answer; the ideal is ≈ 2.4 s (12/12/12/4); burst_vs_ideal: the ratio.",
		extras: []extraCol{{"burst_s", "burst s", "%.2f"}, {"burst_vs_ideal", "vs ideal", "%.2f×"}},
		run:    quickstartMixed,
	},
	{
		name:  "burst-scaleup",
		title: "Hugging Face burst + scale-up: 2 replicas, burst 5× their capacity, 6 replicas added 2 s in",
		about: "2 one-at-a-time replicas of ~200 ms (lognormal σ 0.5; capacity ~10 req/s), Poisson burst at 50 req/s " +
			"for 6 s; 2 s into the burst 6 more replicas are added — to Sluice with POST /_custom_router/set-backends, " +
			"to Caddy least_conn with a config reload (POST /load on its admin API). " +
			"new_first/new_all: seconds from the scale-up call until the first / the last of the new replicas starts serving " +
			"(replica-side, polled every 5 ms).",
		extras: []extraCol{{"new_first_s", "new replica serves after", "%.3f s"}, {"new_all_s", "all 6 serve after", "%.3f s"}},
		run:    burstScaleup,
	},
	{
		name:  "shared-prefix",
		title: "SGLang shared prefixes: 8 long system prompts over 4 prefix-caching replicas",
		about: "8 system prompts of ~520 tokens shared by many chats; 4 replicas with a prefix cache of 30 blocks of 256 " +
			"characters (about 3 prefixes), 0.4 ms prefill per uncached token, 5 ms per output token, 8 sequences at once; " +
			"Poisson 40 req/s. The oracle hashes on the prefix's id (Caddy's header policy on X-Prefix-Id, which " +
			"the others ignore). hit rate = Σ PrefixHits / Σ PrefixQueries over the replicas (prompt tokens).",
		extras: []extraCol{{"hit_rate", "hit rate", "%.2f"}},
		run:    sharedPrefix,
	},
	{
		name:  "noisy-neighbour",
		title: "GIE noisy neighbour: tenant A at 4 req/s, tenant B flooding at 60 req/s, 4 replicas (~40 req/s)",
		about: "4 one-at-a-time replicas of ~100 ms (lognormal σ 0.3; capacity ~40 req/s) behind one proxy; tenant A " +
			"(X-Gateway-Inference-Fairness-Id: A) sends 4 req/s, tenant B 60 req/s, Poisson, 10 s. First A alone, then A + B " +
			"through each system. A_p50/A_p99 are tenant A's latencies; refused counts answers other than 200.",
		extras: []extraCol{{"A_p50_s", "A p50", "%.3f s"}, {"A_p99_s", "A p99", "%.3f s"}, {"A_ok", "A ok", "%.0f"},
			{"A_refused", "A refused", "%.0f"}, {"B_ok", "B ok", "%.0f"}, {"B_refused", "B refused", "%.0f"}, {"B_p99_s", "B p99", "%.3f s"}},
		run: noisyNeighbour,
	},
	{
		name:  "priority-overload",
		title: "GIE priority under overload: premium 12 req/s + batch 60 req/s over 4 replicas (~40 req/s)",
		about: "4 one-at-a-time replicas of ~100 ms (lognormal σ 0.3; capacity ~40 req/s) behind one proxy; premium " +
			"requests (X-Gateway-Inference-Objective: premium) at 12 req/s and batch ones at 60 req/s, Poisson, 10 s; " +
			"first premium alone. The pool can serve all the premium traffic and part of the batch. premium/batch " +
			"p50/p99 are over the requests served; refused = answered, not 200.",
		extras: []extraCol{{"premium_p50_s", "premium p50", "%.3f s"}, {"premium_p99_s", "premium p99", "%.3f s"},
			{"premium_ok", "premium ok", "%.0f"}, {"premium_refused", "premium refused", "%.0f"},
			{"batch_ok", "batch ok", "%.0f"}, {"batch_refused", "batch refused", "%.0f"}, {"batch_p99_s", "batch p99", "%.2f s"}},
		run: priorityOverload,
	},
	flowNewUserScenario,
	multiFlowScenario,
	realEngineScenario,
	engineCalibrationScenario,
	kvEventsScenario,
	{
		name:  "heavy-short-mix",
		title: "Heimdall heavy + short mix: 2 heavy seeds, then a burst every ~10 ms with a heavy request every 50, 4 batching replicas",
		about: "4 batching replicas (4 sequences at once; per token: 50 µs prefill per prompt token, 3 ms per output token, " +
			"each extra running sequence slowing decode by 10%). Scripted, deterministic workload (the shape of " +
			"integration/heavy_mix_bench_test.go): 2 heavy requests 50 ms apart, then from 300 ms a request every 10 ms ± 3 ms, " +
			"short (10–20 words in, 25–40 tokens out) or medium (120–180 words in, 60–90 out), with one heavy " +
			"(1300/1500/2700/4000 words in, 320/350/780/1050 out, cycling) after every 50 and 60 ms of extra gap after it; " +
			"400 requests (120 with -quick), /v1/completions with max_tokens = output tokens. " +
			"makespan = wall time from the first send to the last answer; short/medium/heavy p99 are per request class.",
		extras: []extraCol{{"makespan_s", "makespan", "%.2f s"}, {"short_p99_s", "short p99", "%.2f s"},
			{"medium_p99_s", "medium p99", "%.2f s"}, {"heavy_max_s", "heavy max", "%.2f s"}},
		run: heavyShortMix,
	},
	{
		name:  "heimdall-published",
		title: "Heimdall's published run, scaled: 120 heavy requests at once, then a burst every 50 ms, 4 engine-like replicas",
		about: "The invocation behind seed 003's −18% (`--heavy-seeds 400 --seed-interval 0 --total 800 --burst-start 5 " +
			"--burst-interval 0.5 --jitter 0.5 --inline-extra-gap 0.5 --inline-every 24`), time scaled by 1/10 and " +
			"requests by 0.3 (120 heavy at once, then 120 short/medium every 50 ms ± 50 ms with a heavy after every 24; " +
			"80 in all with -quick). The four heavy specs cycle, so round robin over 4 replicas hands each replica one " +
			"spec, and the one with 4000-word prompts and 1050-token answers falls behind. 4 replicas modelled as the " +
			"engine: up to 64 sequences admitted by KV cache (60k tokens), one prefill at a time (20 µs per prompt " +
			"token) stalling the others' decode (4 ms per output token, 1% slower per extra running sequence). " +
			"makespan = wall time from the first send to the last answer.",
		extras: []extraCol{{"makespan_s", "makespan", "%.2f s"}, {"short_p99_s", "short p99", "%.2f s"},
			{"medium_p99_s", "medium p99", "%.2f s"}, {"heavy_max_s", "heavy max", "%.2f s"}},
		run: heimdallPublished,
	},
	{
		name:  "mixed-fleet-stream",
		title: "Mixed fleet, streaming: 2 fast + 2 half-speed batching replicas, streamed chat at ~70% of the pool",
		about: "4 replicas running 8 sequences each: two decode at 4 ms per output token (100 µs per prompt token), two " +
			"at 8 ms (200 µs), decode 5% slower per extra running sequence. Poisson 30 req/s for 20 s of streamed chat " +
			"completions (SSE, one event per token): 100–400-word prompts, 50–150 output tokens. Round robin gives the " +
			"slow pair half the traffic, more than it can serve. ttft = time to the first streamed token (the " +
			"sim sends a stream's headers at once, as vLLM does, so a proxy's first byte carries no load); slow share = fraction of requests served by the slow pair (≈ 1/3 of " +
			"the pool's capacity).",
		extras: []extraCol{{"ttft_p50_s", "ttft p50", "%.3f s"}, {"ttft_p99_s", "ttft p99", "%.3f s"}, {"slow_share", "slow share", "%.2f"}},
		run:    mixedFleetStream,
	},
	{
		name:  "overhead",
		title: "Proxy overhead: tiny requests at 2000 req/s (open loop) over 4 instant replicas",
		about: "4 replicas answering at once (fixed 0 latency, 256 at a time, 1 output token); Poisson 2000 req/s for 10 s " +
			"(20,000 requests), against the replicas directly and through each proxy; a tiny /v1/completions body. " +
			"proxy CPU/req is the CPU time (user + system, every thread, from /proc) the proxy process spent over the run " +
			"divided by the requests it answered: what each request costs the proxy, the inverse of the throughput it can " +
			"reach on a core of its own. Every system but round_robin itself runs paired: next to its own Caddy " +
			"round_robin (its twin, same binary, same replicas, started with it), the load alternating between the two every " +
			"0.5 s for 20 s, so each gets its 20,000 requests on the same machine at the same time (this shared machine " +
			"drifts by ±5% within a minute; measured one after the other, a 3% difference was lost in the noise). capacity " +
			"vs RR = the twin's CPU/req ÷ the system's over the run (≥ 1: cheaper than round_robin); slice ratio p25/p50/p75: " +
			"the same ratio per pair of half-seconds (a system's and its twin's next), its quartiles over the 20 pairs. " +
			"caddy_round_robin_again is round_robin paired with round_robin: the method's own error (should read 1). " +
			"A paired system's throughput is over its own half of the run. Throughput is the offered rate for every system that keeps up (the load generator, the replicas and the proxy " +
			"share 2 cores, so a saturated run measures the machine, not the proxy).",
		extras: []extraCol{{"proxy_cpu_us", "proxy CPU/req", "%.1f µs"}, {"twin_cpu_us", "twin RR CPU/req", "%.1f µs"},
			{"capacity_vs_rr", "capacity vs RR", "%.3f×"}, {"slice_ratio_p25", "slice ratio p25", "%.3f"},
			{"slice_ratio_p50", "p50", "%.3f"}, {"slice_ratio_p75", "p75", "%.3f"}},
		run: func(r *runner) { overhead(r, false) },
	},
	{
		name:  "overhead-interleaved",
		title: "Proxy overhead, interleaved: tiny requests at 2000 req/s (open loop) over 4 instant replicas, every other request to the twin",
		about: "overhead's replicas, load and measures, but a paired system and its round_robin twin take every other " +
			"request (1000 req/s each, both busy all along) instead of alternating half-seconds. Both proxies then see the " +
			"same machine request by request: on the 2-core dev box round_robin against its twin read 1.000-1.007× " +
			"in every 20 s run, where overhead's half-seconds spread ±0.02-0.03 per rep. Two proxies busy at once share " +
			"the caches as one proxy on a box does not, so what a proxy touches per request weighs more here than in " +
			"overhead. Use it to tell apart changes of a percent or two, within one binary (two builds of the same " +
			"code differed by 3-4% on round_robin alone: compare policy ÷ twin ratios, never CPU/req across builds), " +
			"and overhead for the throughput of one proxy on its own.",
		extras: []extraCol{{"proxy_cpu_us", "proxy CPU/req", "%.1f µs"}, {"twin_cpu_us", "twin RR CPU/req", "%.1f µs"},
			{"capacity_vs_rr", "capacity vs RR", "%.3f×"}},
		run: func(r *runner) { overhead(r, true) },
	},
}

func (r *runner) dur(def, quick time.Duration) time.Duration {
	if r.opt.Quick {
		return quick
	}
	return def
}

func addrs(fleet []*sim.Server) []string {
	out := make([]string, len(fleet))
	for i, s := range fleet {
		out[i] = s.Addr()
	}
	return out
}

func urls(fleet []*sim.Server) []string {
	out := make([]string, len(fleet))
	for i, s := range fleet {
		out[i] = s.URL()
	}
	return out
}

// caddyProxies starts n Caddy instances, each with the site body site(i).
func (r *runner) caddyProxies(name string, n int, site func(i int) string) ([]string, error) {
	ports, err := freePorts(n)
	if err != nil {
		return nil, err
	}
	var out []string
	for i := range n {
		u, err := r.startCaddy(fmt.Sprintf("%s-%d", name, i), ports[i], "off", site(i))
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

func (r *runner) haproxies(name string, n int, servers []string, maxconn int, frontendRules ...string) ([]string, error) {
	ports, err := freePorts(n)
	if err != nil {
		return nil, err
	}
	var out []string
	for i := range n {
		u, err := r.startHAProxy(fmt.Sprintf("%s-%d", name, i), ports[i], servers, maxconn, frontendRules...)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// oneProxy builds the systems of a scenario whose systems differ only in
// the single proxy in front of the same fleet, load and measures.
type oneProxy struct {
	r    *runner
	base sysSpec // fleet, load, after
	// upstreams, if set, are the proxies' upstream addresses (default:
	// the fleet's, addrs): replicas that are not in-process sims.
	upstreams func(f []*sim.Server) []string
}

func (o oneProxy) ups(f []*sim.Server) []string {
	if o.upstreams != nil {
		return o.upstreams(f)
	}
	return addrs(f)
}

// caddy is one Caddy (the Sluice build) with reverse_proxy policy policy.
func (o oneProxy) caddy(name, desc, policy string) sysSpec {
	s := o.base
	s.name, s.desc, s.proxies = name, desc, 1
	s.start = func(f []*sim.Server) ([]string, error) {
		return o.r.caddyProxies(name, 1, func(int) string { return staticProxy(o.ups(f), policy) })
	}
	return s
}

// globalRedisLeast is one Sluice with global_redis_least, defaults, on the
// scenario's private Redis (skipped when there is none).
func (o oneProxy) globalRedisLeast(name, desc, pool, keyPrefix string) sysSpec {
	s := o.caddy(name, desc, "")
	s.start = func(f []*sim.Server) ([]string, error) {
		addr, err := o.r.redisAddr()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errSkipped, err)
		}
		return o.r.caddyProxies(name, 1, func(int) string {
			return staticProxy(o.ups(f), fmt.Sprintf("lb_policy global_redis_least {\n\tpool %s\n\tredis %s\n\tkey_prefix %s\n}", pool, addr, keyPrefix))
		})
	}
	return s
}

// behindCustomRouter is one Sluice with lb_policy policy (its block names
// pool) behind custom_router, the HF contract's handler, seeded with the
// fleet: the way the quick start runs it. A Sluice handler in front sees
// a stream's first token (its first body byte), which a selection policy
// alone cannot where the replicas send a stream's headers at once.
func (o oneProxy) behindCustomRouter(name, desc, pool, policy string) sysSpec {
	s := o.caddy(name, desc, "")
	s.start = func(f []*sim.Server) ([]string, error) {
		var urls []string
		for _, u := range o.ups(f) {
			if !strings.Contains(u, "://") {
				u = "http://" + u
			}
			urls = append(urls, u)
		}
		return o.r.caddyProxies(name, 1, func(int) string {
			return fmt.Sprintf("custom_router %s {\n\tbackends %s\n}\nreverse_proxy {\n\tdynamic custom_router %s\n\t%s\n}",
				pool, strings.Join(urls, " "), pool, strings.ReplaceAll(policy, "\n", "\n\t"))
		})
	}
	return s
}

// references are the classic policies every such scenario compares with:
// Caddy round_robin and least_conn, HAProxy leastconn.
func (o oneProxy) references() []sysSpec {
	return []sysSpec{
		o.caddy("caddy_round_robin", "Caddy lb_policy round_robin", "lb_policy round_robin"),
		o.caddy("caddy_least_conn", "Caddy lb_policy least_conn", "lb_policy least_conn"),
		o.haproxyLeastconn(),
	}
}

// haproxyLeastconn is one HAProxy with balance leastconn (no maxconn).
func (o oneProxy) haproxyLeastconn() sysSpec {
	s := o.base
	s.name, s.desc, s.proxies = "haproxy_leastconn", "HAProxy balance leastconn", 1
	s.start = func(f []*sim.Server) ([]string, error) { return o.r.haproxies("haproxy-lc", 1, addrs(f), 0) }
	return s
}

func staticProxy(ups []string, policy string) string {
	return fmt.Sprintf("reverse_proxy %s {\n\t%s\n}", strings.Join(ups, " "), strings.ReplaceAll(policy, "\n", "\n\t"))
}

// ---- local-view ----------------------------------------------------------

func localView(r *runner) {
	const replicas, rate = 16, 136.0
	arrivals := poisson(rate, r.dur(12*time.Second, 2*time.Second), 11)
	fleet := make([]sim.Config, replicas)
	for i := range fleet {
		fleet[i] = sim.Config{Name: fmt.Sprintf("lv-%02d", i), Concurrency: 1,
			Latency: sim.Latency{Kind: sim.LatencyLognormal, Duration: 100 * time.Millisecond, Sigma: 0.5},
			Seed:    uint64(i + 1)}
	}
	load := func(_ []*sim.Server, proxies []string) workload {
		return workload{arrivals: arrivals, build: func(n int) (*http.Request, int) {
			p := n % len(proxies)
			req, _ := http.NewRequest(http.MethodPost, proxies[p]+"/v1/completions",
				strings.NewReader(`{"prompt":"remove the background","max_tokens":4}`))
			req.Header.Set("Content-Type", "application/json")
			return req, p
		}}
	}
	caddyPolicy := func(name, desc, policy string) sysSpec {
		return sysSpec{name: name, desc: desc, proxies: 4, fleet: fleet, load: load,
			start: func(f []*sim.Server) ([]string, error) {
				return r.caddyProxies(name, 4, func(int) string { return staticProxy(addrs(f), policy) })
			}}
	}
	keyPrefix := fmt.Sprintf("bench-%d", time.Now().UnixNano()%1e9)
	systems := []sysSpec{
		caddyPolicy("caddy_round_robin_x4", "4 Caddy, lb_policy round_robin", "lb_policy round_robin"),
		caddyPolicy("caddy_random_choose_2_x4", "4 Caddy, lb_policy random_choose 2", "lb_policy random_choose 2"),
		caddyPolicy("caddy_least_conn_x4", "4 Caddy, lb_policy least_conn (local view)", "lb_policy least_conn"),
		{name: "haproxy_leastconn_x4", desc: "4 HAProxy, balance leastconn (local view)", proxies: 4, fleet: fleet, load: load,
			start: func(f []*sim.Server) ([]string, error) { return r.haproxies("haproxy-lc", 4, addrs(f), 0) }},
		{name: "sluice_global_redis_least_x4", desc: "4 Sluice, global_redis_least, one shared Redis", proxies: 4, fleet: fleet, load: load,
			start: func(f []*sim.Server) ([]string, error) {
				addr, err := r.redisAddr()
				if err != nil {
					return nil, fmt.Errorf("%w: %v", errSkipped, err)
				}
				return r.caddyProxies("sluice-grl", 4, func(i int) string {
					return staticProxy(addrs(f), fmt.Sprintf("lb_policy global_redis_least {\n\tpool lv\n\tredis %s\n\tkey_prefix %s\n\tinstance_id p%d\n}",
						addr, keyPrefix, i))
				})
			}},
		{name: "sluice_global_redis_queue_x4", desc: "4 Sluice, global_redis_least queueing mode (max_inflight 1, one global queue in Redis)", proxies: 4, fleet: fleet, load: load,
			start: func(f []*sim.Server) ([]string, error) {
				addr, err := r.redisAddr()
				if err != nil {
					return nil, fmt.Errorf("%w: %v", errSkipped, err)
				}
				return r.caddyProxies("sluice-grlq", 4, func(i int) string {
					return staticProxy(addrs(f), fmt.Sprintf("lb_policy global_redis_least {\n\tpool lvq\n\tredis %s\n\tkey_prefix %s-q\n\tinstance_id q%d\n\tmax_inflight 1\n\tqueue_timeout 30s\n}",
						addr, keyPrefix, i))
				})
			}},
		{name: "central_haproxy_maxconn1", desc: "reference: ONE HAProxy, leastconn, maxconn 1 per server (queues in HAProxy)", proxies: 1, fleet: fleet, load: load,
			start: func(f []*sim.Server) ([]string, error) { return r.haproxies("haproxy-central", 1, addrs(f), 1) }},
		{name: "central_sluice_qll_1ms", desc: "reference: ONE Sluice, queued_least_latency, latency_threshold 1ms (queues at the edge)", proxies: 1, fleet: fleet, load: load,
			start: func(f []*sim.Server) ([]string, error) {
				return r.caddyProxies("sluice-qll", 1, func(int) string {
					return staticProxy(addrs(f), "lb_policy queued_least_latency {\n\tpool lv-central\n\tlatency_threshold 1ms\n}")
				})
			}},
	}
	for _, s := range systems {
		r.system(s)
	}
}

// ---- burst-scaleup -------------------------------------------------------

func burstScaleup(r *runner) {
	const initial, added = 2, 6
	burst := r.dur(6*time.Second, 3*time.Second)
	scaleAt := r.dur(2*time.Second, 1*time.Second)
	arrivals := poisson(50, burst, 42)
	fleet := make([]sim.Config, initial+added)
	for i := range fleet {
		fleet[i] = sim.Config{Name: fmt.Sprintf("hf-%d", i), Concurrency: 1,
			Latency: sim.Latency{Kind: sim.LatencyLognormal, Duration: 200 * time.Millisecond, Sigma: 0.5},
			Seed:    uint64(i + 1)}
	}

	// scaleTimes measures, replica-side, when the new replicas start
	// serving relative to the scale-up call.
	type scaleTimes struct {
		mu       sync.Mutex
		called   time.Time
		first    time.Time
		firstOf  map[int]time.Time
		callTook time.Duration
	}
	mk := func(name, desc string, start func(f []*sim.Server) ([]string, error),
		scale func(ctx context.Context, f []*sim.Server, proxy string) error) sysSpec {
		st := &scaleTimes{firstOf: map[int]time.Time{}}
		return sysSpec{name: name, desc: desc, proxies: 1, fleet: fleet, start: start, reqTimeout: 60 * time.Second,
			load: func(f []*sim.Server, proxies []string) workload {
				return workload{
					arrivals: arrivals,
					build: func(n int) (*http.Request, int) {
						req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/completions",
							strings.NewReader(`{"prompt":"draw a cat","max_tokens":4}`))
						req.Header.Set("Content-Type", "application/json")
						return req, 0
					},
					actions: []action{{at: scaleAt, do: func(ctx context.Context) error {
						st.mu.Lock()
						st.called = time.Now()
						st.mu.Unlock()
						err := scale(ctx, f, proxies[0])
						st.mu.Lock()
						st.callTook = time.Since(st.called)
						st.mu.Unlock()
						return err
					}}},
					monitor: func(ctx context.Context) {
						tk := time.NewTicker(5 * time.Millisecond)
						defer tk.Stop()
						for {
							select {
							case <-ctx.Done():
								return
							case now := <-tk.C:
								st.mu.Lock()
								for i := initial; i < len(f); i++ {
									if _, ok := st.firstOf[i]; !ok && f[i].Replica().Stats().Started > 0 {
										st.firstOf[i] = now
										if st.first.IsZero() {
											st.first = now
										}
									}
								}
								done := len(st.firstOf) == added
								st.mu.Unlock()
								if done {
									return
								}
							}
						}
					},
				}
			},
			after: func(f []*sim.Server, _ []Record, s *Summary) {
				st.mu.Lock()
				defer st.mu.Unlock()
				if st.called.IsZero() {
					return
				}
				s.Extra["scale_call_s"] = st.callTook.Seconds()
				if !st.first.IsZero() {
					s.Extra["new_first_s"] = max(0, st.first.Sub(st.called).Seconds())
				} else {
					s.Notes = append(s.Notes, "no new replica served")
				}
				if len(st.firstOf) == added {
					var last time.Time
					for _, t := range st.firstOf {
						if t.After(last) {
							last = t
						}
					}
					s.Extra["new_all_s"] = max(0, last.Sub(st.called).Seconds())
				} else {
					s.Notes = append(s.Notes, fmt.Sprintf("only %d of %d new replicas served", len(st.firstOf), added))
				}
			}}
	}

	setBackends := func(ctx context.Context, f []*sim.Server, proxy string) error {
		b, _ := json.Marshal(map[string][]string{"backends": urls(f)})
		return post(ctx, proxy+"/_custom_router/set-backends", "application/json", string(b))
	}
	sluice := func(threshold string) func(f []*sim.Server) ([]string, error) {
		return func(f []*sim.Server) ([]string, error) {
			th := ""
			if threshold != "" {
				th = "\n\t\tlatency_threshold " + threshold
			}
			return r.caddyProxies("sluice-hf", 1, func(int) string {
				return fmt.Sprintf("custom_router hf {\n\tbackends %s\n}\nreverse_proxy {\n\tdynamic custom_router hf\n\tlb_policy queued_least_latency {\n\t\tpool hf%s\n\t}\n}",
					strings.Join(urls(f)[:initial], " "), th)
			})
		}
	}
	// Caddy least_conn: scale-up is a config reload through the admin API.
	var adminAddr string
	var lcPort int
	lcSite := func(ups []string) string { return staticProxy(ups, "lb_policy least_conn") }
	systems := []sysSpec{
		mk("sluice_qll_50ms", "Sluice queued_least_latency, latency_threshold 50ms; scale-up: set-backends", sluice("50ms"), setBackends),
		mk("sluice_qll_default", "Sluice queued_least_latency, defaults (adaptive: learned free slots, queue at the edge); scale-up: set-backends", sluice(""), setBackends),
		mk("sluice_qll_3s", "Sluice queued_least_latency, latency_threshold 3s (the reference router's rule and default); scale-up: set-backends", sluice("3s"), setBackends),
		withReloadLosses(scaleAt, mk("caddy_least_conn_reload", "Caddy least_conn, static upstreams; scale-up: POST /load with 8 upstreams",
			func(f []*sim.Server) ([]string, error) {
				ports, err := freePorts(2)
				if err != nil {
					return nil, err
				}
				lcPort, adminAddr = ports[0], fmt.Sprintf("127.0.0.1:%d", ports[1])
				u, err := r.startCaddy("caddy-lc", lcPort, adminAddr, lcSite(addrs(f)[:initial]))
				if err != nil {
					return nil, err
				}
				return []string{u}, nil
			},
			func(ctx context.Context, f []*sim.Server, _ string) error {
				return post(ctx, "http://"+adminAddr+"/load", "text/caddyfile", caddyfile(lcPort, adminAddr, lcSite(addrs(f))))
			})),
	}
	for _, s := range systems {
		r.system(s)
	}
}

// withReloadLosses marks s, a Caddy scaled up by a config reload at
// reloadAt, as losing requests to the reload's race (reloadRaceLoss).
func withReloadLosses(reloadAt time.Duration, s sysSpec) sysSpec {
	s.lossExplained = func(rec Record) (string, bool) { return reloadRaceLoss(rec, reloadAt) }
	return s
}

// reloadRaceLoss reports whether rec is a request a Caddy reload at
// reloadAt lost: sent within the old config's grace period, written on a
// kept-alive connection, answered EOF. The old server closes its idle
// connections as it stops; one the client has just written a request
// on reads EOF, and net/http does not retry a POST once it is written.
// That is how Caddy (and HTTP/1.1 keep-alive) behaves, not the harness.
func reloadRaceLoss(rec Record, reloadAt time.Duration) (string, bool) {
	if !rec.Lost() || rec.Start < reloadAt || rec.Start > reloadAt+caddyGracePeriod {
		return "", false
	}
	if on := rec.LostOn; !on.KeptAlive || !on.Written || !on.EOF {
		return "", false
	}
	return "written on a kept-alive connection the reload closed (EOF)", true
}

// ---- shared-prefix -------------------------------------------------------

func sharedPrefix(r *runner) {
	const replicas, rate = 4, 40.0
	arrivals := poisson(rate, r.dur(15*time.Second, 2*time.Second), 7)
	fleet := make([]sim.Config, replicas)
	for i := range fleet {
		fleet[i] = sim.Config{Name: fmt.Sprintf("pfx-%d", i), Concurrency: 8, MaxTokens: 4,
			Latency:     sim.Latency{Kind: sim.LatencyPerToken, Prefill: 400 * time.Microsecond, Decode: 5 * time.Millisecond},
			PrefixCache: sim.PrefixCache{Blocks: 30, BlockChars: 256},
			Seed:        uint64(i + 1)}
	}
	prefixes := make([]string, 8)
	for i := range prefixes {
		prefixes[i] = fmt.Sprintf("System prompt %d. ", i) + strings.Repeat(fmt.Sprintf("Rule %d of tenant %d: be precise and cite sources. ", i, i), 40)
	}
	// The same bodies, in the same order, for every system.
	rng := rand.New(rand.NewPCG(7, 70))
	type body struct {
		id   int
		json string
	}
	bodies := make([]body, len(arrivals))
	for n := range bodies {
		id := rng.IntN(len(prefixes))
		b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]string{
			{"role": "system", "content": prefixes[id]},
			{"role": "user", "content": fmt.Sprintf("Question %d: what changed?", n)},
		}})
		bodies[n] = body{id, string(b)}
	}
	load := func(_ []*sim.Server, proxies []string) workload {
		return workload{arrivals: arrivals, build: func(n int) (*http.Request, int) {
			req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/chat/completions", strings.NewReader(bodies[n].json))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Prefix-Id", fmt.Sprint(bodies[n].id))
			return req, 0
		}}
	}
	hitRate := func(f []*sim.Server, _ []Record, s *Summary) {
		var q, h uint64
		for _, srv := range f {
			st := srv.Replica().Stats()
			q += st.PrefixQueries
			h += st.PrefixHits
		}
		if q > 0 {
			s.Extra["hit_rate"] = float64(h) / float64(q)
		}
	}
	sys := oneProxy{r: r, base: sysSpec{fleet: fleet, load: load, after: hitRate}}
	caddy := sys.caddy
	systems := append(sys.references(),
		caddy("oracle_header_hash", "oracle: Caddy lb_policy header X-Prefix-Id (knows the prefix id)", "lb_policy header X-Prefix-Id"),
		caddy("sluice_cache_aware", "Sluice cache_aware, defaults (least_load on miss)", "lb_policy cache_aware {\n\tpool pfx\n}"),
	)
	for _, s := range systems {
		r.system(s)
	}
}

// ---- noisy-neighbour -----------------------------------------------------

func noisyNeighbour(r *runner) {
	d := r.dur(10*time.Second, 2*time.Second)
	a := poisson(4, d, 1)
	b := poisson(60, d, 2)
	both := mergeArrivals([]string{"A", "B"}, a, b)
	fleet := gieFleet("nn")
	load := func(aOnly bool) func(_ []*sim.Server, proxies []string) workload {
		list := both
		if aOnly {
			list = mergeArrivals([]string{"A"}, a)
		}
		return func(_ []*sim.Server, proxies []string) workload {
			return workload{arrivals: arrivalTimes(list), class: func(n int) string { return list[n].class },
				build: func(n int) (*http.Request, int) {
					req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/completions", strings.NewReader(`{"prompt":"hello","max_tokens":4}`))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Gateway-Inference-Fairness-Id", list[n].class)
					return req, 0
				}}
		}
	}
	perTenant := perClass("A", "B")
	flow := func(f []*sim.Server) ([]string, error) {
		return r.caddyProxies("sluice-fc", 1, func(int) string {
			return fmt.Sprintf(`custom_router nn {
	backends %s
}
flow_control nn {
	trusted_sources 127.0.0.0/8
	max_concurrency 1
	default_ttl 5s
	band 0 {
		fairness round_robin
		max_requests 40
	}
}
reverse_proxy {
	dynamic custom_router nn
	lb_policy least_conn
}`, strings.Join(urls(f), " "))
		})
	}
	systems := []sysSpec{
		{name: "A_alone_sluice_flow_control", desc: "tenant A alone (4 req/s), through Sluice flow_control", proxies: 1, fleet: fleet,
			load: load(true), after: perTenant, start: flow},
		{name: "caddy_least_conn", desc: "A + B flood, Caddy least_conn", proxies: 1, fleet: fleet, load: load(false), after: perTenant,
			start: func(f []*sim.Server) ([]string, error) {
				return r.caddyProxies("caddy-lc", 1, func(int) string { return staticProxy(addrs(f), "lb_policy least_conn") })
			}},
		{name: "haproxy_leastconn_maxconn1", desc: "A + B flood, HAProxy leastconn, maxconn 1 per server (FIFO queue in HAProxy)", proxies: 1,
			fleet: fleet, load: load(false), after: perTenant,
			start: func(f []*sim.Server) ([]string, error) { return r.haproxies("haproxy-nn", 1, addrs(f), 1) }},
		{name: "sluice_flow_control", desc: "A + B flood, Sluice flow_control (round_robin fairness, max_concurrency 1, band queue 40, TTL 5 s) + least_conn",
			proxies: 1, fleet: fleet, load: load(false), after: perTenant, start: flow},
	}
	for _, s := range systems {
		r.system(s)
	}
}

// perClass adds each class's served, refused (answered, not 200) and
// p50/p99 (over the served) as <class>_ok, _refused, _p50_s, _p99_s.
func perClass(classes ...string) func(_ []*sim.Server, recs []Record, s *Summary) {
	return func(_ []*sim.Server, recs []Record, s *Summary) {
		for _, c := range classes {
			var sub []Record
			for _, rec := range recs {
				if rec.Class == c {
					sub = append(sub, rec)
				}
			}
			if len(sub) == 0 {
				continue
			}
			cs := summarize(c, "", 1, nil, sub)
			s.Extra[c+"_ok"] = float64(cs.OK)
			s.Extra[c+"_refused"] = float64(len(sub) - cs.OK - cs.Lost)
			if cs.OK > 0 {
				s.Extra[c+"_p50_s"] = cs.P50
				s.Extra[c+"_p99_s"] = cs.P99
			}
		}
	}
}

// ---- overhead ------------------------------------------------------------

// overhead runs the overhead scenario; interleaved: a paired system and
// its twin take every other request instead of alternating half-seconds.
func overhead(r *runner, interleaved bool) {
	d := r.dur(10*time.Second, 1*time.Second)
	kind, err := overheadRequestOf(r.opt.OverheadRequest)
	if err != nil {
		r.res.Failures = append(r.res.Failures, err.Error())
		return
	}
	if r.opt.OverheadRequest != "" && r.opt.OverheadRequest != "tiny" {
		r.res.suffix = "-" + r.opt.OverheadRequest
		r.res.Title = strings.Replace(r.res.Title, "tiny requests at 2000 req/s", fmt.Sprintf("%s at %g req/s", kind.about, kind.rate), 1)
		r.res.About = fmt.Sprintf("Run with -overhead-request %s: each request is one of %s, at %g req/s in all (where the text below says tiny "+
			"completions at 2000). ", r.opt.OverheadRequest, kind.about, kind.rate) + r.res.About
	}
	arrivals := poisson(kind.rate, d, 5)
	// A paired system's run is twice as long, half of it for its twin.
	pairedArrivals := poisson(kind.rate, 2*d, 5)
	fleet := make([]sim.Config, 4)
	for i := range fleet {
		fleet[i] = sim.Config{Name: fmt.Sprintf("ov-%d", i), Concurrency: 256, MaxTokens: kind.tokens, Seed: uint64(i + 1)}
	}
	// Unpaired (round_robin itself, direct): the proxy's CPU over its run.
	var cpuAtStart time.Duration
	load := func(_ []*sim.Server, proxies []string) workload {
		cpuAtStart = r.proxyCPU()
		return workload{arrivals: arrivals, build: func(n int) (*http.Request, int) {
			p := n % len(proxies)
			return kind.build(proxies[p], n), p
		}}
	}
	after := func(_ []*sim.Server, _ []Record, s *Summary) {
		if s.Proxies == 0 || s.OK == 0 {
			return
		}
		per := (r.proxyCPU() - cpuAtStart) / time.Duration(s.OK)
		s.Extra["proxy_cpu_us"] = float64(per) / float64(time.Microsecond)
		s.Extra["capacity_vs_rr"] = 1
	}
	// Paired: the system runs next to its own Caddy round_robin (its
	// twin, started with it over the same replicas), and the load
	// alternates between the two every overheadSlice. A run on a shared
	// machine drifts by ±5% and more within a minute; two proxies measured
	// in alternating half-seconds see the same machine, so their ratio is
	// what the proxies differ by. (Measured one after the other, as
	// before, a 3% difference was lost in the noise.)
	// CPU samples at the slice boundaries (each written by its own
	// action), then one once every answer is in (the run's end).
	var slices []pairSlice
	pairedLoad := func(_ []*sim.Server, proxies []string) workload {
		boundaries := int(2*d/overheadSlice) + 1
		slices = make([]pairSlice, boundaries+1)
		w := workload{arrivals: pairedArrivals, build: func(n int) (*http.Request, int) {
			p := overheadSliceOf(pairedArrivals[n]) % 2
			if interleaved {
				p = n % 2
			}
			return kind.build(proxies[p], n), p
		}}
		for k := range boundaries {
			w.actions = append(w.actions, action{at: time.Duration(k) * overheadSlice, do: func(context.Context) error {
				slices[k].x, slices[k].twin = r.pairCPU()
				return nil
			}})
		}
		return w
	}
	pairedAfter := func(_ []*sim.Server, all []Record, s *Summary) {
		last := &slices[len(slices)-1]
		last.x, last.twin = r.pairCPU()
		pairedCapacity(slices, all, s, !interleaved)
		// Its throughput over its own half of the run (interleaved: over
		// the whole run, at half the rate).
		s.Throughput = float64(s.OK) / d.Seconds()
		if interleaved {
			s.Throughput /= 2
		}
	}
	sys := oneProxy{r: r, base: sysSpec{fleet: fleet, load: load, after: after}}
	// paired turns a one-proxy system into its run next to a round_robin
	// twin; its summary is made of its own requests.
	paired := func(s sysSpec) sysSpec {
		start := s.start
		s.load, s.after = pairedLoad, pairedAfter
		s.keep = func(rec Record) bool { return rec.Proxy == 0 }
		s.start = func(f []*sim.Server) ([]string, error) {
			ps, err := start(f)
			if err != nil {
				return nil, err
			}
			twin, err := r.caddyProxies(s.name+"-rr-twin", 1, func(int) string { return staticProxy(addrs(f), "lb_policy round_robin") })
			if err != nil {
				return nil, err
			}
			return append(ps, twin...), nil
		}
		return s
	}
	caddy := sys.caddy
	keyPrefix := fmt.Sprintf("bench-ov-%d", time.Now().UnixNano()%1e9)
	grl := sys.globalRedisLeast("sluice_global_redis_least", "Sluice global_redis_least, defaults (one private Redis)", "ov-grl", keyPrefix)
	// flow_control, defaults, in front of the twin's own policy: what the
	// handler costs a request that passes straight through (capacity 4 ×
	// 100 in flight is never reached here).
	flow := caddy("sluice_flow_control", "Sluice flow_control, defaults, in front of Caddy lb_policy round_robin", "lb_policy round_robin")
	flow.start = func(f []*sim.Server) ([]string, error) {
		return r.caddyProxies("sluice_flow_control", 1, func(int) string {
			return "flow_control ov-fc\n" + staticProxy(addrs(f), "lb_policy round_robin")
		})
	}
	systems := []sysSpec{
		caddy("caddy_round_robin", "Caddy lb_policy round_robin", "lb_policy round_robin"),
		{name: "direct", desc: "no proxy: the client spreads requests round-robin over the replicas", proxies: 0, fleet: fleet, load: load,
			start: func(f []*sim.Server) ([]string, error) { return urls(f), nil }},
		paired(sys.haproxyLeastconn()),
		paired(caddy("sluice_qll", "Sluice queued_least_latency, defaults", "lb_policy queued_least_latency {\n\tpool ov-qll\n}")),
		paired(caddy("sluice_cache_aware", "Sluice cache_aware, defaults", "lb_policy cache_aware {\n\tpool ov-ca\n}")),
		paired(caddy("sluice_load_aware", "Sluice load_aware, defaults", "lb_policy load_aware {\n\tpool ov-la\n}")),
		paired(grl),
		paired(flow),
		paired(caddy("caddy_round_robin_again", "Caddy lb_policy round_robin next to its round_robin twin: the method's own error (capacity vs RR should read 1)", "lb_policy round_robin")),
	}
	for _, s := range systems {
		r.system(s)
	}
}

// overheadSlice is how long the load stays on one proxy of a pair before
// it moves to the other.
const overheadSlice = 500 * time.Millisecond

func overheadSliceOf(at time.Duration) int { return int(at / overheadSlice) }

// pairSlice is the CPU time of a paired system's proxies and of its twin
// at one slice boundary.
type pairSlice struct{ x, twin time.Duration }

// pairedCapacity sets a paired system's measures from the CPU samples at
// the slice boundaries (the last one after every answer came in): proxy
// CPU/req over the whole run (both proxies were alive all along, each
// loaded half of the time), capacity vs RR = the twin's CPU/req ÷ the
// system's, and the quartiles of that ratio over the slice pairs (a
// system's slice and its twin's next one); without perSliceRatios (the
// two took every other request, overhead-interleaved), no slice is one
// proxy's, and only the run's ratio is made.
func pairedCapacity(slices []pairSlice, all []Record, s *Summary, perSliceRatios bool) {
	if len(slices) < 2 {
		return
	}
	var okX, okTwin int
	perSlice := map[int][2]int{} // slice -> OK requests of the system, the twin
	for _, rec := range all {
		if rec.Status != 200 {
			continue
		}
		if rec.Proxy == 0 {
			okX++
		} else {
			okTwin++
		}
		if !perSliceRatios {
			continue
		}
		// The load picked the proxy by the arrival's slice; a request is
		// sent at or a little after its arrival, so a Start in the other
		// proxy's slice means it was due in the slice before.
		k := overheadSliceOf(rec.Start)
		if k%2 != rec.Proxy && k > 0 {
			k--
		}
		c := perSlice[k]
		c[rec.Proxy]++
		perSlice[k] = c
	}
	first, last := slices[0], slices[len(slices)-1]
	if okX == 0 || okTwin == 0 {
		return
	}
	cpuX := float64(last.x-first.x) / float64(okX)
	cpuTwin := float64(last.twin-first.twin) / float64(okTwin)
	s.Extra["proxy_cpu_us"] = cpuX / float64(time.Microsecond)
	s.Extra["twin_cpu_us"] = cpuTwin / float64(time.Microsecond)
	if cpuX > 0 {
		s.Extra["capacity_vs_rr"] = cpuTwin / cpuX
	}
	if !perSliceRatios { // interleaved: no slice is one proxy's
		return
	}
	// Slice k is the system's for even k, the twin's for odd k; slice k
	// spans samples k and k+1. The run's last sample (after every answer)
	// is not a boundary: the slices before it are.
	var ratios []float64
	for k := 0; k+2 < len(slices)-1; k += 2 {
		nx, nt := perSlice[k][0], perSlice[k+1][1]
		dx, dt := slices[k+1].x-slices[k].x, slices[k+2].twin-slices[k+1].twin
		if nx == 0 || nt == 0 || dx <= 0 {
			continue
		}
		ratios = append(ratios, (float64(dt)/float64(nt))/(float64(dx)/float64(nx)))
	}
	if len(ratios) >= 4 {
		sort.Float64s(ratios)
		q := func(p float64) float64 { return ratios[int(p*float64(len(ratios)-1)+0.5)] }
		s.Extra["slice_ratio_p25"], s.Extra["slice_ratio_p50"], s.Extra["slice_ratio_p75"] = q(0.25), q(0.5), q(0.75)
	}
}

// pairCPU is the CPU time of the running proxies but the last started
// (a paired system's), and of the last (its twin), as proxyCPU counts it.
func (r *runner) pairCPU() (x, twin time.Duration) {
	r.procs.mu.Lock()
	var pids []int
	for _, p := range r.procs.live {
		pids = append(pids, p.cmd.Process.Pid)
	}
	r.procs.mu.Unlock()
	for i, pid := range pids {
		if i == len(pids)-1 {
			twin = pidCPU(pid)
		} else {
			x += pidCPU(pid)
		}
	}
	return x, twin
}

// proxyCPU is the CPU time (user + system) the running proxies have used
// so far, summed over their threads, from /proc (0 elsewhere).
func (r *runner) proxyCPU() time.Duration {
	r.procs.mu.Lock()
	var pids []int
	for _, p := range r.procs.live {
		pids = append(pids, p.cmd.Process.Pid)
	}
	r.procs.mu.Unlock()
	var total time.Duration
	for _, pid := range pids {
		total += pidCPU(pid)
	}
	return total
}

// pidCPU is one process's CPU time, summed over its threads, from /proc.
func pidCPU(pid int) time.Duration {
	var total time.Duration
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		// schedstat: time on CPU (ns), time waiting, timeslices.
		if f := strings.Fields(string(b)); len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			total += time.Duration(ns)
		}
	}
	return total
}

// ---- local-view-prefix ---------------------------------------------------

// localViewPrefix: the shared-prefix shape behind 4 proxies, each seeing a
// quarter of the traffic: cache_aware with one tree per instance, with the
// trees shared through Redis, one instance, and the local-view peers.
func localViewPrefix(r *runner) {
	const replicas, rate = 4, 40.0
	arrivals := poisson(rate, r.dur(15*time.Second, 2*time.Second), 17)
	fleet := make([]sim.Config, replicas)
	for i := range fleet {
		fleet[i] = sim.Config{Name: fmt.Sprintf("lvp-%d", i), Concurrency: 8, MaxTokens: 4,
			Latency:     sim.Latency{Kind: sim.LatencyPerToken, Prefill: 400 * time.Microsecond, Decode: 5 * time.Millisecond},
			PrefixCache: sim.PrefixCache{Blocks: 30, BlockChars: 256},
			Seed:        uint64(i + 1)}
	}
	prefixes := make([]string, 12)
	for i := range prefixes {
		prefixes[i] = fmt.Sprintf("System prompt %d. ", i) + strings.Repeat(fmt.Sprintf("Rule %d of tenant %d: be precise and cite sources. ", i, i), 40)
	}
	rng := rand.New(rand.NewPCG(17, 170))
	bodies := make([]string, len(arrivals))
	for n := range bodies {
		id := rng.IntN(len(prefixes))
		b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]string{
			{"role": "system", "content": prefixes[id]},
			{"role": "user", "content": fmt.Sprintf("Question %d: what changed?", n)},
		}})
		bodies[n] = string(b)
	}
	load := func(_ []*sim.Server, proxies []string) workload {
		return workload{arrivals: arrivals, build: func(n int) (*http.Request, int) {
			p := n % len(proxies)
			req, _ := http.NewRequest(http.MethodPost, proxies[p]+"/v1/chat/completions", strings.NewReader(bodies[n]))
			req.Header.Set("Content-Type", "application/json")
			return req, p
		}}
	}
	hitRate := func(f []*sim.Server, _ []Record, s *Summary) {
		var q, h uint64
		for _, srv := range f {
			st := srv.Replica().Stats()
			q += st.PrefixQueries
			h += st.PrefixHits
		}
		if q > 0 {
			s.Extra["hit_rate"] = float64(h) / float64(q)
		}
	}
	keyPrefix := fmt.Sprintf("bench-lvp-%d", time.Now().UnixNano()%1e9)
	caddyPolicy := func(name, desc string, n int, policy func(i int) (string, error)) sysSpec {
		return sysSpec{name: name, desc: desc, proxies: n, fleet: fleet, load: load, after: hitRate,
			start: func(f []*sim.Server) ([]string, error) {
				pols := make([]string, n)
				for i := range pols {
					p, err := policy(i)
					if err != nil {
						return nil, err
					}
					pols[i] = p
				}
				return r.caddyProxies(name, n, func(i int) string { return staticProxy(addrs(f), pols[i]) })
			}}
	}
	fixed := func(s string) func(int) (string, error) { return func(int) (string, error) { return s, nil } }
	systems := []sysSpec{
		caddyPolicy("sluice_cache_aware_x1", "ONE Sluice, cache_aware (all the traffic through one tree)", 1,
			fixed("lb_policy cache_aware {\n\tpool lvp\n}")),
		caddyPolicy("sluice_cache_aware_shared_x4", "4 Sluice, cache_aware, trees shared through one Redis", 4,
			func(int) (string, error) {
				addr, err := r.redisAddr()
				if err != nil {
					return "", fmt.Errorf("%w: %v", errSkipped, err)
				}
				return fmt.Sprintf("lb_policy cache_aware {\n\tpool lvp\n\tredis %s\n\tkey_prefix %s\n}", addr, keyPrefix), nil
			}),
		caddyPolicy("sluice_cache_aware_local_x4", "4 Sluice, cache_aware, one tree per instance (local view)", 4,
			fixed("lb_policy cache_aware {\n\tpool lvp\n}")),
		caddyPolicy("caddy_least_conn_x4", "4 Caddy, lb_policy least_conn (local view)", 4, fixed("lb_policy least_conn")),
		{name: "haproxy_leastconn_x4", desc: "4 HAProxy, balance leastconn (local view)", proxies: 4, fleet: fleet, load: load, after: hitRate,
			start: func(f []*sim.Server) ([]string, error) { return r.haproxies("haproxy-lvp", 4, addrs(f), 0) }},
	}
	for _, s := range systems {
		r.system(s)
	}
}
