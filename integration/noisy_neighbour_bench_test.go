package integration

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkNoisyNeighbour is GIE's noisy-neighbour scenario: 4
// one-at-a-time replicas of ~100 ms (capacity ~40 req/s) behind one proxy;
// tenant A sends 4 req/s, tenant B floods at 60 req/s. Reported: A's p99
// alone, and with B through Caddy least_conn and through flow_control with
// round-robin fairness; B's served and refused counts. Run with:
//
//	go test -run '^$' -bench NoisyNeighbour -benchtime 1x ./integration/
func BenchmarkNoisyNeighbour(b *testing.B) {
	var ups []string
	var cfg strings.Builder
	cfg.WriteString(globals)
	for r := 0; r < 4; r++ {
		port := 9741 + r
		ups = append(ups, fmt.Sprintf("127.0.0.1:%d", port))
		fmt.Fprintf(&cfg, "\n:%d {\n\tbind 127.0.0.1\n\tinference_sim {\n\t\tname nn-%d\n\t\tconcurrency 1\n\t\tlatency lognormal 100ms 0.3\n\t\tseed %d\n\t}\n}\n", port, r, r+1)
	}
	fmt.Fprintf(&cfg, `
:9731 {
	reverse_proxy %[1]s {
		lb_policy least_conn
	}
}
:9732 {
	flow_control nn {
		trusted_sources 127.0.0.0/8
		objective premium 100
		objective batch -10
		max_concurrency 1
		default_ttl 5s
		band 0 {
			fairness round_robin
			max_requests 40
		}
	}
	reverse_proxy %[1]s {
		lb_policy least_conn
	}
}
`, strings.Join(ups, " "))
	startCaddy(b, cfg.String())
	// flow_control's concurrency detector counts the pool's replicas from
	// its backend set.
	setBackendsAdmin(b, "nn", "http://"+strings.Join(ups, " http://"))

	d := benchDuration(15 * time.Second)
	tenantWith := func(url, id, objective string, rate float64, seed uint64) ([]time.Duration, int) {
		return openLoop(rate, d, seed, func(int, *rand.Rand) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"hello"}`))
			req.Header.Set("X-Gateway-Inference-Fairness-Id", id)
			if objective != "" {
				req.Header.Set("X-Gateway-Inference-Objective", objective)
			}
			return req
		})
	}
	tenant := func(url, id string, rate float64, seed uint64) ([]time.Duration, int) {
		return tenantWith(url, id, "", rate, seed)
	}
	p99 := func(lat []time.Duration) float64 {
		slices.Sort(lat)
		if len(lat) == 0 {
			return 0
		}
		return lat[int(0.99*float64(len(lat)-1))].Seconds() * 1000
	}
	b.Run("tenant_A_alone", func(b *testing.B) {
		lat, failed := tenant("http://127.0.0.1:9732", "A", 4, 1)
		b.ReportMetric(p99(lat), "A_p99_ms")
		b.ReportMetric(float64(failed), "A_failed")
	})
	b.Run("premium_vs_batch_flood_flow_control", func(b *testing.B) { benchPriority(b, tenantWith, p99) })
	for _, sys := range []struct{ name, url string }{
		{"with_flood_caddy_least_conn", "http://127.0.0.1:9731"},
		{"with_flood_flow_control", "http://127.0.0.1:9732"},
	} {
		b.Run(sys.name, func(b *testing.B) {
			var wg sync.WaitGroup
			var bLat []time.Duration
			var bFailed int
			wg.Add(1)
			go func() {
				defer wg.Done()
				bLat, bFailed = tenant(sys.url, "B", 60, 2)
			}()
			aLat, aFailed := tenant(sys.url, "A", 4, 1)
			wg.Wait()
			b.ReportMetric(p99(aLat), "A_p99_ms")
			b.ReportMetric(float64(aFailed), "A_failed")
			b.ReportMetric(float64(len(bLat)), "B_served")
			b.ReportMetric(float64(bFailed), "B_refused")
			b.ReportMetric(p99(bLat), "B_p99_ms")
		})
	}
}

// (see BenchmarkNoisyNeighbour) The priority-inversion case: premium
// traffic at 4 req/s while a batch band floods at 60 req/s.
func benchPriority(b *testing.B, tenantWith func(url, id, objective string, rate float64, seed uint64) ([]time.Duration, int), p99 func([]time.Duration) float64) {
	var wg sync.WaitGroup
	var batchLat []time.Duration
	var batchFailed int
	wg.Add(1)
	go func() {
		defer wg.Done()
		batchLat, batchFailed = tenantWith("http://127.0.0.1:9732", "batch-jobs", "batch", 60, 2)
	}()
	lat, failed := tenantWith("http://127.0.0.1:9732", "premium-app", "premium", 4, 1)
	wg.Wait()
	b.ReportMetric(p99(lat), "premium_p99_ms")
	b.ReportMetric(float64(failed), "premium_failed")
	b.ReportMetric(float64(len(batchLat)), "batch_served")
	b.ReportMetric(float64(batchFailed), "batch_refused")
}

// setBackendsAdmin sets a pool's backend set through the admin API.
func setBackendsAdmin(t testing.TB, pool, urls string) {
	t.Helper()
	body := `{"backends": ["` + strings.Join(strings.Fields(urls), `","`) + `"]}`
	resp, err := client.Post(adminURL+"/sluice/pools/"+pool+"/set-backends", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("admin set-backends: %d", resp.StatusCode)
	}
}
