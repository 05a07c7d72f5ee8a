package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkHeavyShortMix replays the shape of Heimdall's experiment (seed
// 003): two heavy requests first to pin replicas, then a burst of short and
// medium requests every ~10 ms with a heavy one inlined every 50, over 4
// batching replicas (4 sequences at once, decode slowing as the batch
// grows). Reported: makespan (wall-clock time until the last answer) and
// latency. Run with -benchtime 1x:
//
//	go test -run '^$' -bench HeavyShortMix -benchtime 1x ./integration/
func BenchmarkHeavyShortMix(b *testing.B) {
	systems := []struct{ name, policy string }{
		{"caddy_round_robin", "lb_policy round_robin"},
		{"caddy_least_conn", "lb_policy least_conn"},
		{"sluice_load_aware_default", "lb_policy load_aware {\n\t\t\tpool mix-default\n\t\t\tmetrics_interval 100ms\n\t\t}"},
		{"sluice_load_aware_load_only", "lb_policy load_aware {\n\t\t\tpool mix-load\n\t\t\tmetrics_interval 100ms\n\t\t\tscorer queue\n\t\t\tscorer load_aware\n\t\t\tscorer active_request\n\t\t}"},
		{"sluice_load_aware_kv_active", "lb_policy load_aware {\n\t\t\tpool mix-kv\n\t\t\tmetrics_interval 100ms\n\t\t\tscorer active_request 2\n\t\t\tscorer kv_cache\n\t\t\tscorer queue\n\t\t}"},
		{"sluice_load_aware_tokens", "lb_policy load_aware {\n\t\t\tpool mix-tokens\n\t\t\tscorer active_tokens\n\t\t}"},
	}
	var cfg strings.Builder
	cfg.WriteString(globals)
	for i, s := range systems {
		port := 9700 + 10*i
		var ups []string
		for r := 1; r <= 4; r++ {
			ups = append(ups, fmt.Sprintf("127.0.0.1:%d", port+r))
			fmt.Fprintf(&cfg, `
:%d {
	bind 127.0.0.1
	inference_sim {
		name mix-%d-%d
		max_num_seqs 4
		latency per_token 50us 3ms batch_slowdown 0.1
		seed %d
	}
}
`, port+r, i, r, r)
		}
		fmt.Fprintf(&cfg, "\n:%d {\n\treverse_proxy %s {\n\t\t%s\n\t}\n}\n", port, strings.Join(ups, " "), s.policy)
	}
	startCaddy(b, cfg.String())
	work := heavyMixWorkload(400)
	for i, s := range systems {
		b.Run(s.name, func(b *testing.B) {
			url := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", 9700+10*i)
			makespan, lat, failed := runSchedule(url, work)
			q := func(p float64) float64 { return lat[int(p*float64(len(lat)-1))].Seconds() }
			b.ReportMetric(makespan.Seconds(), "makespan_s")
			b.ReportMetric(q(0.5), "p50_s")
			b.ReportMetric(q(0.99), "p99_s")
			b.ReportMetric(float64(failed), "failed")
		})
	}
}

type scheduled struct {
	at   time.Duration
	body []byte
}

// heavyMixWorkload builds the seed's workload shape, scaled: 2 heavy seeds
// 50 ms apart, then from 300 ms a burst every 10 ms ± 3 ms of short
// (10–20 words in, 25–40 tokens out) and medium (120–180 in, 60–90 out)
// requests, with one heavy (1300–4000 words in, 320–1050 out) inlined
// after every 50 and 60 ms of extra gap after it. Deterministic (seeded).
func heavyMixWorkload(total int) []scheduled {
	rng := rand.New(rand.NewPCG(42, 42))
	heavy := [][2]int{{1300, 320}, {1500, 350}, {2700, 780}, {4000, 1050}}
	words := func(n, tag int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "[%d] ", tag)
		for i := 0; i < n; i++ {
			b.WriteString([]string{"tensor ", "routing ", "kernel ", "cache ", "decode "}[rng.IntN(5)])
		}
		return b.String()
	}
	req := func(isl, osl, tag int) []byte {
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": words(isl, tag), "max_tokens": osl})
		return body
	}
	var out []scheduled
	for i := 0; i < 2; i++ {
		out = append(out, scheduled{time.Duration(i) * 50 * time.Millisecond, req(heavy[i][0], heavy[i][1], i)})
	}
	t := 300 * time.Millisecond
	heavyIdx := 0
	for n := 0; len(out) < total; n++ {
		var isl, osl int
		inline := n > 0 && n%51 == 50
		switch {
		case inline:
			isl, osl = heavy[heavyIdx%4][0], heavy[heavyIdx%4][1]
			heavyIdx++
		case rng.IntN(2) == 0:
			isl, osl = 10+rng.IntN(11), 25+rng.IntN(16)
		default:
			isl, osl = 120+rng.IntN(61), 60+rng.IntN(31)
		}
		out = append(out, scheduled{t, req(isl, osl, 1000+n)})
		t += 10*time.Millisecond + time.Duration(rng.IntN(7)-3)*time.Millisecond
		if inline {
			t += 60 * time.Millisecond
		}
	}
	return out
}

// runSchedule sends each request at its time and returns the makespan,
// the sorted latencies of the successes and the number of failures.
func runSchedule(url string, work []scheduled) (time.Duration, []time.Duration, int) {
	c := &http.Client{Timeout: 120 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	defer c.CloseIdleConnections()
	var (
		mu     sync.Mutex
		lat    []time.Duration
		failed int
		wg     sync.WaitGroup
	)
	start := time.Now()
	for _, w := range work {
		time.Sleep(time.Until(start.Add(w.at)))
		wg.Add(1)
		go func(body []byte) {
			defer wg.Done()
			t0 := time.Now()
			resp, err := c.Post(url, "application/json", strings.NewReader(string(body)))
			ok := err == nil && resp.StatusCode == 200
			if err == nil {
				resp.Body.Close()
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				lat = append(lat, time.Since(t0))
			} else {
				failed++
			}
		}(w.body)
	}
	wg.Wait()
	makespan := time.Since(start)
	slices.Sort(lat)
	return makespan, lat, failed
}
