package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// ---- heavy-short-mix -----------------------------------------------------

// mixRequest is one scripted request of the heavy-short-mix workload.
type mixRequest struct {
	at    time.Duration
	class string // "heavy", "short" or "medium"
	body  string
}

// heavyMixScript builds Heimdall's workload shape (seed 003), scaled and
// deterministic: 2 heavy seeds 50 ms apart, then from 300 ms a request
// every 10 ms ± 3 ms, short (10–20 words in, 25–40 tokens out) or medium
// (120–180 words in, 60–90 out) at random, with one heavy (1300 / 1500 /
// 2700 / 4000 words in, 320 / 350 / 780 / 1050 out, cycling) inlined after
// every 50 and 60 ms of extra gap after it; total requests in all. Each
// body is a /v1/completions request with max_tokens = its output tokens.
// It is the shape of integration/heavy_mix_bench_test.go (same seed).
func heavyMixScript(total int) []mixRequest {
	return mixScript(mixShape{total: total, heavySeeds: 2, seedInterval: 50 * time.Millisecond,
		burstStart: 300 * time.Millisecond, burstInterval: 10 * time.Millisecond, jitter: 3 * time.Millisecond,
		inlineEvery: 50, inlineGap: 60 * time.Millisecond})
}

// mixShape holds the knobs of Heimdall's workload generator (seed 003's
// workload.py), already scaled to this machine's time.
type mixShape struct {
	total, heavySeeds, inlineEvery                  int
	seedInterval, burstStart, burstInterval, jitter time.Duration
	inlineGap                                       time.Duration
}

// mixScript builds the workload: heavySeeds heavy requests (specs cycling)
// seedInterval apart, then from burstStart a burst every burstInterval ±
// jitter of short or medium requests, one heavy inlined after every
// inlineEvery, with inlineGap of extra gap after it.
func mixScript(sh mixShape) []mixRequest {
	total := sh.total
	rng := rand.New(rand.NewPCG(42, 42))
	heavy := [][2]int{{1300, 320}, {1500, 350}, {2700, 780}, {4000, 1050}}
	vocab := []string{"tensor ", "routing ", "kernel ", "cache ", "decode "}
	body := func(in, out, tag int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "[%d] ", tag)
		for range in {
			b.WriteString(vocab[rng.IntN(len(vocab))])
		}
		j, _ := json.Marshal(map[string]any{"model": "m", "prompt": b.String(), "max_tokens": out})
		return string(j)
	}
	var out []mixRequest
	for i := 0; i < sh.heavySeeds && len(out) < total; i++ {
		h := heavy[i%len(heavy)]
		out = append(out, mixRequest{time.Duration(i) * sh.seedInterval, "heavy", body(h[0], h[1], i)})
	}
	t := sh.burstStart
	heavyIdx := 0
	for n := 0; len(out) < total; n++ {
		var in, osl int
		class := "short"
		inline := n > 0 && n%(sh.inlineEvery+1) == sh.inlineEvery
		switch {
		case inline:
			in, osl = heavy[heavyIdx%4][0], heavy[heavyIdx%4][1]
			heavyIdx++
			class = "heavy"
		case rng.IntN(2) == 0:
			in, osl = 10+rng.IntN(11), 25+rng.IntN(16)
		default:
			in, osl = 120+rng.IntN(61), 60+rng.IntN(31)
			class = "medium"
		}
		out = append(out, mixRequest{t, class, body(in, osl, 1000+n)})
		t += sh.burstInterval
		if sh.jitter > 0 {
			t += time.Duration(rng.Int64N(int64(2*sh.jitter)+1)) - sh.jitter
		}
		if inline {
			t += sh.inlineGap
		}
	}
	return out
}

func heavyShortMix(r *runner) {
	total := 400
	if r.opt.Quick {
		total = 120
	}
	runMix(r, heavyMixScript(total), func(c *sim.Config) { c.Concurrency = 4 })
}

// heimdallPublished is the invocation behind Heimdall's −18% (seed 003:
// `--heavy-seeds 400 --seed-interval 0 --total 800 --burst-start 5
// --burst-interval 0.5 --jitter 0.5 --inline-extra-gap 0.5 --inline-every
// 24`), with time scaled 1/10: 400 heavy requests at once (the four specs
// cycling, so round robin over 4 replicas gives each replica one spec),
// then 400 short/medium requests every 50 ms ± 50 ms with a heavy one
// after every 24. Replicas batch up to 64 sequences, decode slowing 1% per
// extra sequence.
func heimdallPublished(r *runner) {
	sh := mixShape{total: 240, heavySeeds: 120, seedInterval: time.Millisecond, burstStart: 500 * time.Millisecond,
		burstInterval: 50 * time.Millisecond, jitter: 50 * time.Millisecond, inlineEvery: 24, inlineGap: 50 * time.Millisecond}
	if r.opt.Quick {
		sh.total, sh.heavySeeds = 80, 40
	}
	runMix(r, mixScript(sh), func(c *sim.Config) {
		// An engine as the seed ran it: up to 64 sequences, admitted by KV
		// cache (a 4000-word prompt holds ~7000 tokens), one prefill at a
		// time stalling the others' decode.
		c.Concurrency = 64
		c.Latency.Prefill = 20 * time.Microsecond
		c.Latency.Decode = 4 * time.Millisecond
		c.Latency.BatchSlowdown = 0.01
		c.KVCapacityTokens = 60_000
		c.PrefillBlocksDecode = true
	})
}

// runMix runs a scripted heavy/short workload over 4 batching replicas
// (per token: 50 µs prefill, 3 ms decode, 10% slower per extra running
// sequence), adjusted by engine.
func runMix(r *runner, script []mixRequest, engine func(*sim.Config)) {
	arrivals := make([]time.Duration, len(script))
	for i, m := range script {
		arrivals[i] = m.at
	}
	fleet := make([]sim.Config, 4)
	for i := range fleet {
		fleet[i] = sim.Config{Name: fmt.Sprintf("mix-%d", i),
			Latency: sim.Latency{Kind: sim.LatencyPerToken, Prefill: 50 * time.Microsecond,
				Decode: 3 * time.Millisecond, BatchSlowdown: 0.1},
			Seed: uint64(i + 1)}
		engine(&fleet[i])
	}
	load := func(_ []*sim.Server, proxies []string) workload {
		// One client event loop, as the seed's generator: requests due at
		// the same instant leave in script order.
		return workload{arrivals: arrivals, ordered: true, class: func(n int) string { return script[n].class },
			build: func(n int) (*http.Request, int) {
				req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/completions", strings.NewReader(script[n].body))
				req.Header.Set("Content-Type", "application/json")
				return req, 0
			}}
	}
	measures := func(_ []*sim.Server, recs []Record, s *Summary) {
		// Makespan: from the first send to the last answer.
		first, last := time.Duration(-1), time.Duration(0)
		for _, rec := range recs {
			if first < 0 || rec.Start < first {
				first = rec.Start
			}
			if !rec.Lost() {
				last = max(last, rec.Start+rec.Latency)
			}
		}
		if first >= 0 && last > first {
			s.Extra["makespan_s"] = (last - first).Seconds()
		}
		for _, c := range []string{"short", "medium", "heavy"} {
			var sub []Record
			for _, rec := range recs {
				if rec.Class == c {
					sub = append(sub, rec)
				}
			}
			if cs := summarize(c, "", 1, nil, sub); cs.OK > 0 {
				s.Extra[c+"_p50_s"] = cs.P50
				s.Extra[c+"_p99_s"] = cs.P99
				s.Extra[c+"_max_s"] = cs.Max
			}
		}
	}
	sys := oneProxy{r: r, base: sysSpec{fleet: fleet, load: load, after: measures}}
	caddy := sys.caddy
	systems := append(sys.references(),
		// Defaults only: no option but the pool (active_request + active_tokens).
		caddy("sluice_load_aware_default", "Sluice load_aware, defaults (active_request + active_tokens at 1)",
			"lb_policy load_aware {\n\tpool mix-default\n}"),
		caddy("sluice_load_aware_heimdall", "Sluice load_aware, preset heimdall (the seed's five scorers), metrics_interval 100ms",
			"lb_policy load_aware {\n\tpool mix-heimdall\n\tpreset heimdall\n\tmetrics_interval 100ms\n}"),
		caddy("sluice_load_aware_active_only", "Sluice load_aware, active_request scorer only (Sluice's exact in-flight counts)",
			"lb_policy load_aware {\n\tpool mix-active\n\tscorer active_request\n}"),
		caddy("sluice_load_aware_tokens", "Sluice load_aware, active_tokens scorer only (Sluice's in-flight counts weighted by each request's prompt + max_tokens)",
			"lb_policy load_aware {\n\tpool mix-tokens\n\tscorer active_tokens\n}"),
		caddy("sluice_load_aware_count1_tokens2", "Sluice load_aware, active_request 1 + active_tokens 2",
			"lb_policy load_aware {\n\tpool mix-c1t2\n\tscorer active_request 1\n\tscorer active_tokens 2\n}"),
		caddy("sluice_load_aware_count2_tokens1", "Sluice load_aware, active_request 2 + active_tokens 1",
			"lb_policy load_aware {\n\tpool mix-c2t1\n\tscorer active_request 2\n\tscorer active_tokens 1\n}"),
		caddy("sluice_load_aware_heimdall_tokens", "Sluice load_aware, preset heimdall's five scorers + active_tokens, metrics_interval 100ms",
			"lb_policy load_aware {\n\tpool mix-heimdall-tokens\n\tmetrics_interval 100ms\n\tscorer queue\n\tscorer load_aware\n\tscorer active_request\n\tscorer session_affinity\n\tscorer no_hit_lru\n\tscorer active_tokens\n}"),
	)
	for _, s := range systems {
		r.system(s)
	}
}
