package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkSharedPrefixes is the cache-aware scenario: 8 long system
// prompts shared by many chats, over 4 prefix-caching replicas whose KV
// cache holds about 3 of the prefixes each, so where a request lands
// decides whether its prefill is cached. Compared: round robin,
// least_conn, an oracle that hashes on the prefix's id (Caddy's header
// policy on X-Prefix-Id, which the others do not get), and cache_aware
// with both miss policies. Replica-side hit rate (tokens) comes from the
// simulators' own counters. Run with -benchtime 1x:
//
//	go test -run '^$' -bench SharedPrefixes -benchtime 1x ./integration/
func BenchmarkSharedPrefixes(b *testing.B) { benchPrefixes(b, 0) }

// BenchmarkSharedPrefixesWithUniques mixes in 30% long one-off prompts,
// which miss everywhere: the case where the miss policy matters.
func BenchmarkSharedPrefixesWithUniques(b *testing.B) { benchPrefixes(b, 0.3) }

func benchPrefixes(b *testing.B, uniqueFrac float64) {
	systems := []struct{ name, policy string }{
		{"caddy_round_robin", "lb_policy round_robin"},
		{"caddy_least_conn", "lb_policy least_conn"},
		{"oracle_header_hash", "lb_policy header X-Prefix-Id"},
		{"sluice_cache_aware_least_load", "lb_policy cache_aware {\n\t\t\tpool pfx-ll\n\t\t}"},
		{"sluice_cache_aware_smallest_tree", "lb_policy cache_aware {\n\t\t\tpool pfx-st\n\t\t\tmiss_policy smallest_tree\n\t\t}"},
	}
	var cfg strings.Builder
	cfg.WriteString(globals)
	for i, s := range systems {
		port := 9500 + 10*i
		var ups []string
		for r := 1; r <= 4; r++ {
			ups = append(ups, fmt.Sprintf("127.0.0.1:%d", port+r))
			// ~520 tokens per prompt; 0.4 ms prefill per uncached token
			// (a cold prompt costs ~200 ms), 5 ms per output token; cache of
			// 30 blocks of 256 chars ≈ 3 prefixes of 8 blocks plus tails.
			fmt.Fprintf(&cfg, `
:%d {
	bind 127.0.0.1
	inference_sim {
		name pfx-%d-%d
		max_num_seqs 8
		latency per_token 400us 5ms
		prefix_cache 30 256
		max_tokens 4
		seed %d
	}
}
`, port+r, i, r, r)
		}
		fmt.Fprintf(&cfg, `
:%d {
	reverse_proxy %s {
		%s
	}
}
`, port, strings.Join(ups, " "), s.policy)
	}
	startCaddy(b, cfg.String())

	prefixes := make([]string, 8)
	for i := range prefixes {
		prefixes[i] = fmt.Sprintf("System prompt %d. ", i) + strings.Repeat(fmt.Sprintf("Rule %d of tenant %d: be precise and cite sources. ", i, i), 40)
	}
	for i, s := range systems {
		b.Run(s.name, func(b *testing.B) {
			url := fmt.Sprintf("http://127.0.0.1:%d", 9500+10*i)
			lat, failed := sharedPrefixLoad(url, prefixes, uniqueFrac, 40, benchDuration(20*time.Second))
			var queries, hits uint64
			for r := 1; r <= 4; r++ {
				st := simReplica(b, fmt.Sprintf("pfx-%d-%d", i, r)).Stats()
				queries += st.PrefixQueries
				hits += st.PrefixHits
			}
			slices.Sort(lat)
			q := func(p float64) float64 { return lat[int(p*float64(len(lat)-1))].Seconds() }
			b.ReportMetric(float64(hits)/float64(max(queries, 1)), "hit_rate")
			b.ReportMetric(q(0.5)*1000, "p50_ms")
			b.ReportMetric(q(0.99)*1000, "p99_ms")
			b.ReportMetric(float64(failed), "failed")
			b.ReportMetric(float64(len(lat)), "requests")
		})
	}
}

// sharedPrefixLoad sends Poisson arrivals at rate/s for d: each a chat
// with one of the prefixes (uniformly) as system prompt, or with
// probability uniqueFrac a long one-off prompt, and a unique question;
// X-Prefix-Id carries the prefix's id for the oracle.
func sharedPrefixLoad(url string, prefixes []string, uniqueFrac, rate float64, d time.Duration) ([]time.Duration, int) {
	return openLoop(rate, d, 7, func(n int, rng *rand.Rand) *http.Request {
		id := rng.IntN(len(prefixes))
		system := prefixes[id]
		if rng.Float64() < uniqueFrac {
			id = len(prefixes) + n // its own id: the oracle spreads these by hash
			system = fmt.Sprintf("One-off document %d: ", n) + strings.Repeat(fmt.Sprintf("paragraph %d of a unique text. ", n), 60)
		}
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": fmt.Sprintf("Question %d: what changed?", n)},
		}})
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(string(body)))
		req.Header.Set("X-Prefix-Id", fmt.Sprint(id))
		return req
	})
}
