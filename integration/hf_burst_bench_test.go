package integration

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkHFBurst replays the Hugging Face finding on simulated replicas:
// 8 one-at-a-time replicas of ~200 ms (lognormal), Poisson arrivals at
// 30 req/s (75% of capacity) for 15 s, open loop. The reference router with
// its default 3 s threshold herded this load onto one replica (p50 3.1 s,
// p99 12.5 s); tuned to 0.05 s it reached p99 1.25 s. Sluice should land
// near the tuned figure with its defaults. Run with -benchtime 1x:
//
//	go test -run '^$' -bench HFBurst -benchtime 1x ./integration/
func BenchmarkHFBurst(b *testing.B) {
	var simPorts []int
	var backends []string
	for p := 9411; p <= 9418; p++ {
		simPorts = append(simPorts, p)
		backends = append(backends, fmt.Sprintf("127.0.0.1:%d", p))
	}
	sites := sims(simPorts...)
	sites = strings.ReplaceAll(sites, "latency fixed 150ms", "latency lognormal 200ms 0.5")
	startCaddy(b, globals+fmt.Sprintf(`
:9401 {
	custom_router hf-default
	reverse_proxy {
		dynamic custom_router hf-default
		lb_policy queued_least_latency {
			pool hf-default
		}
	}
}
:9402 {
	custom_router hf-tuned
	reverse_proxy {
		dynamic custom_router hf-tuned
		lb_policy queued_least_latency {
			pool hf-tuned
			latency_threshold 0.05
		}
	}
}
:9403 {
	reverse_proxy %[1]s {
		lb_policy least_conn
	}
}
:9404 {
	reverse_proxy %[1]s {
		lb_policy round_robin
	}
}
`, strings.Join(backends, " "))+sites)
	urls := make([]string, len(backends))
	for i, a := range backends {
		urls[i] = "http://" + a
	}
	setBackends(b, "http://127.0.0.1:9401", urls...)
	setBackends(b, "http://127.0.0.1:9402", urls...)

	for _, sys := range []struct{ name, url string }{
		{"sluice_qll_default", "http://127.0.0.1:9401"},
		{"sluice_qll_threshold_0.05", "http://127.0.0.1:9402"},
		{"caddy_least_conn", "http://127.0.0.1:9403"},
		{"caddy_round_robin", "http://127.0.0.1:9404"},
	} {
		b.Run(sys.name, func(b *testing.B) {
			lat, failed := openLoop(30, benchDuration(15*time.Second), 42, func(int, *rand.Rand) *http.Request {
				req, _ := http.NewRequest(http.MethodPost, sys.url+"/v1/completions", strings.NewReader(`{"prompt":"draw a cat"}`))
				return req
			})
			slices.Sort(lat)
			q := func(p float64) float64 { return lat[int(p*float64(len(lat)-1))].Seconds() }
			b.ReportMetric(q(0.5), "p50_s")
			b.ReportMetric(q(0.99), "p99_s")
			b.ReportMetric(lat[len(lat)-1].Seconds(), "max_s")
			b.ReportMetric(float64(failed), "failed")
			b.ReportMetric(float64(len(lat)), "requests")
		})
	}
}

// benchDuration is def, or SLUICE_BENCH_SECONDS when set (longer runs give
// steadier tail percentiles).
func benchDuration(def time.Duration) time.Duration {
	if s, err := strconv.Atoi(os.Getenv("SLUICE_BENCH_SECONDS")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return def
}

// openLoop fires Poisson arrivals at rate/s for d, open loop: build makes
// arrival n's request (on the arrival loop, so it may use rng), and each is
// sent on its own goroutine. It returns every successful request's latency
// and the number that failed.
func openLoop(rate float64, d time.Duration, seed uint64, build func(n int, rng *rand.Rand) *http.Request) ([]time.Duration, int) {
	rng := rand.New(rand.NewPCG(seed, seed))
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	defer c.CloseIdleConnections()
	var (
		mu     sync.Mutex
		lat    []time.Duration
		failed int
		wg     sync.WaitGroup
	)
	start := time.Now()
	next := start
	for n := 0; next.Sub(start) < d; n++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		time.Sleep(time.Until(next))
		req := build(n, rng)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := c.Do(req)
			ok := err == nil && resp.StatusCode == 200
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				lat = append(lat, time.Since(t0))
			} else {
				failed++
			}
		}()
	}
	wg.Wait()
	return lat, failed
}
