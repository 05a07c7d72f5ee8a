package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// ---- mixed-fleet-stream --------------------------------------------------

// mixedFleetStream is the everyday case latency-aware routing exists for:
// streaming chat over a pool of two GPU generations. Two replicas decode
// twice as fast as the other two (4 vs 8 ms per output token, 100 vs
// 200 µs per prompt token), each runs 8 sequences at once (decode 5%
// slower per extra one), and Poisson arrivals at 30 req/s (~70% of the
// pool) ask for 50–150 tokens after a 100–400-word prompt, all streamed
// (SSE, one event per token). Round robin gives the slow pair half the
// traffic, more than it can serve; the question is how close each policy
// gets to sending each replica what it can take, measured by time to
// first token (the first SSE chunk with text: the replicas send a
// stream's headers at once, as vLLM does, so its first byte says nothing)
// and time to the last token.
func mixedFleetStream(r *runner) {
	const rate = 30.0
	arrivals := poisson(rate, r.dur(20*time.Second, 3*time.Second), 23)
	fleet := make([]sim.Config, 4)
	for i := range fleet {
		speed := time.Duration(1 + i/2) // replicas 0, 1 fast; 2, 3 half as fast
		fleet[i] = sim.Config{Name: fmt.Sprintf("gpu-%s-%d", []string{"fast", "slow"}[i/2], i), Concurrency: 8,
			Latency: sim.Latency{Kind: sim.LatencyPerToken, Prefill: 100 * time.Microsecond * speed,
				Decode: 4 * time.Millisecond * speed, BatchSlowdown: 0.05},
			Seed: uint64(i + 1)}
	}
	// The same bodies, in the same order, for every system.
	rng := rand.New(rand.NewPCG(23, 230))
	vocab := strings.Fields("tensor routing kernel cache decode prefill batch stream token replica")
	bodies := make([]string, len(arrivals))
	for n := range bodies {
		var b strings.Builder
		fmt.Fprintf(&b, "Chat %d: ", n)
		for range 100 + rng.IntN(301) {
			b.WriteString(vocab[rng.IntN(len(vocab))] + " ")
		}
		j, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "max_tokens": 50 + rng.IntN(101),
			"messages": []map[string]string{{"role": "user", "content": b.String()}}})
		bodies[n] = string(j)
	}
	load := func(_ []*sim.Server, proxies []string) workload {
		return workload{arrivals: arrivals, sse: true, build: func(n int) (*http.Request, int) {
			req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/chat/completions", strings.NewReader(bodies[n]))
			req.Header.Set("Content-Type", "application/json")
			return req, 0
		}}
	}
	measures := func(_ []*sim.Server, recs []Record, s *Summary) {
		var ttft []time.Duration
		for _, rec := range recs {
			if rec.Status == 200 && rec.Err == "" && rec.Tokens > 0 {
				ttft = append(ttft, rec.TTFT)
			}
		}
		slices.Sort(ttft)
		s.Extra["ttft_p50_s"], s.Extra["ttft_p99_s"] = quantile(ttft, 0.50), quantile(ttft, 0.99)
		slow, ok := 0, 0
		for _, rec := range recs {
			if rec.Status == 200 && rec.Err == "" {
				ok++
				if strings.Contains(rec.Replica, "slow") {
					slow++
				}
			}
		}
		if ok > 0 {
			s.Extra["slow_share"] = float64(slow) / float64(ok)
		}
	}
	sys := oneProxy{r: r, base: sysSpec{fleet: fleet, load: load, after: measures}}
	caddy := sys.caddy
	systems := append(sys.references(),
		caddy("sluice_qll", "Sluice queued_least_latency, parallelism 8 (time to first byte for streams)",
			"lb_policy queued_least_latency {\n\tpool mf-qll\n\tparallelism 8\n}"),
		caddy("sluice_qll_defaults", "Sluice queued_least_latency, defaults (parallelism 1: each replica taken as serving one request at a time)",
			"lb_policy queued_least_latency {\n\tpool mf-qll-defaults\n}"),
		caddy("sluice_load_aware_heimdall", "Sluice load_aware, preset heimdall (the seed's five scorers), metrics_interval 100ms",
			"lb_policy load_aware {\n\tpool mf-heimdall\n\tpreset heimdall\n\tmetrics_interval 100ms\n}"),
		caddy("sluice_load_aware_metrics", "Sluice load_aware, queue + kv_cache + active_request, metrics_interval 100ms",
			"lb_policy load_aware {\n\tpool mf-metrics\n\tmetrics_interval 100ms\n\tscorer queue\n\tscorer kv_cache\n\tscorer active_request\n}"),
		caddy("sluice_load_aware_default", "Sluice load_aware, defaults (active_request + active_tokens)",
			"lb_policy load_aware {\n\tpool mf-default\n}"),
	)
	// The same defaults behind custom_router: the replicas send a
	// stream's headers at once, and only a Sluice handler in front sees
	// its first token.
	systems = append(systems, sys.behindCustomRouter("sluice_qll_defaults_custom_router",
		"Sluice queued_least_latency, defaults, behind custom_router (learns from a stream's first token)",
		"mf-cr", "lb_policy queued_least_latency {\n\tpool mf-cr\n}"))
	for _, s := range systems {
		r.system(s)
	}
}
