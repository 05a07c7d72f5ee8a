package bench

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// ---- quickstart-mixed ----------------------------------------------------

// quickstartMixed is what a new user does first with Caddyfile.example:
// one streamed chat request, one plain completion, then a burst of 40
// plain completions, over its four one-at-a-time replicas (three of
// ~200 ms, one of ~400 ms). The ideal burst takes about 2.4 s (12/12/12/4:
// every replica busy until the queue is empty, the slow one taking what
// it can finish in time). OpenAI-style clients mix streamed and plain
// requests on one pool: a stream's first byte (~40 ms when it came with
// the first token; now at once, as vLLM sends a stream's headers) fed
// into the same estimate as completions' last byte (~200 ms) made one
// replica look 5× faster, and it got half of the burst.
func quickstartMixed(r *runner) {
	const burstN = 40 // the quick start
	fleet := make([]sim.Config, 4)
	for i := range fleet {
		d := 200 * time.Millisecond
		if i == 3 {
			d = 400 * time.Millisecond
		}
		fleet[i] = sim.Config{Name: fmt.Sprintf("qs-%d", i+1), Concurrency: 1,
			Latency: sim.Latency{Kind: sim.LatencyLognormal, Duration: d, Sigma: 0.3},
			Seed:    uint64(i + 1)}
	}
	// The stream at 0, the plain completion once it is done, the burst
	// once both are: the burst starts on an idle pool that has learned
	// from one stream and one completion.
	burstAt := 1500 * time.Millisecond
	arrivals := []time.Duration{0, 700 * time.Millisecond}
	for range burstN {
		arrivals = append(arrivals, burstAt)
	}
	class := func(n int) string {
		switch n {
		case 0:
			return "stream"
		case 1:
			return "plain"
		}
		return "burst"
	}
	load := func(_ []*sim.Server, proxies []string) workload {
		return workload{arrivals: arrivals, ordered: true, class: class,
			build: func(n int) (*http.Request, int) {
				var req *http.Request
				if n == 0 {
					req, _ = http.NewRequest(http.MethodPost, proxies[0]+"/v1/chat/completions",
						strings.NewReader(`{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}`))
				} else {
					req, _ = http.NewRequest(http.MethodPost, proxies[0]+"/v1/completions",
						strings.NewReader(`{"prompt":"Hello","max_tokens":8}`))
				}
				req.Header.Set("Content-Type", "application/json")
				return req, 0
			}}
	}
	after := func(_ []*sim.Server, recs []Record, s *Summary) {
		var end time.Duration
		per := map[string]int{}
		for _, rec := range recs {
			if rec.Class != "burst" || rec.Lost() {
				continue
			}
			end = max(end, rec.Start+rec.Latency)
			per[rec.Replica]++
		}
		if end > burstAt {
			s.Extra["burst_s"] = (end - burstAt).Seconds()
			s.Extra["burst_vs_ideal"] = (end - burstAt).Seconds() / 2.4
		}
		var names []string
		for i := range fleet {
			names = append(names, fmt.Sprintf("%d", per[fleet[i].Name]))
		}
		s.Notes = append(s.Notes, "burst per replica (3 × 200 ms, 400 ms): "+strings.Join(names, "/"))
	}
	o := oneProxy{r: r, base: sysSpec{fleet: fleet, load: load, after: after, reqTimeout: 60 * time.Second}}
	qll := func(extra string) string {
		return "lb_policy queued_least_latency {\n\tpool qs" + extra + "\n}"
	}
	systems := []sysSpec{
		o.caddy("sluice_qll_default", "Sluice queued_least_latency as in Caddyfile.example: defaults (adaptive)", qll("")),
		o.caddy("sluice_qll_3s", "Sluice queued_least_latency, latency_threshold 3s (the reference router's rule and default)", qll("\n\tlatency_threshold 3s")),
		o.caddy("sluice_qll_50ms", "Sluice queued_least_latency, latency_threshold 50ms (tuned)", qll("\n\tlatency_threshold 50ms")),
	}
	systems = append(systems, o.references()...)
	mc1 := o.base
	mc1.name, mc1.desc, mc1.proxies = "haproxy_maxconn1", "HAProxy leastconn, maxconn 1 per server (queues in HAProxy: tuned for one-at-a-time)", 1
	mc1.start = func(f []*sim.Server) ([]string, error) { return r.haproxies("haproxy-mc1", 1, addrs(f), 1) }
	systems = append(systems, mc1)
	for _, s := range systems {
		r.system(s)
	}
}
