package integration

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkLocalView is Photoroom's scenario, scaled: 4 proxies in front
// of 16 one-at-a-time replicas (~100 ms lognormal), Poisson arrivals at 85%
// of the fleet's capacity spread evenly over the proxies. Each proxy of a
// local-view policy sees a quarter of the load; global_redis_least shares
// one view through Redis; the reference is one central queue (a single
// Sluice queued_least_latency with a tiny threshold: one request per
// replica, the rest wait at the edge). Run with -benchtime 1x:
//
//	bash scripts/test.sh -run '^$' -bench LocalView -benchtime 1x   # or with SLUICE_TEST_REDIS_ADDR set
func BenchmarkLocalView(b *testing.B) {
	addr := testRedis(b)
	var replicas []string
	var cfg strings.Builder
	cfg.WriteString(globals)
	for r := 0; r < 16; r++ {
		port := 9931 + r
		replicas = append(replicas, fmt.Sprintf("127.0.0.1:%d", port))
		fmt.Fprintf(&cfg, "\n:%d {\n\tbind 127.0.0.1\n\tinference_sim {\n\t\tname lv-%d\n\t\tconcurrency 1\n\t\tlatency lognormal 100ms 0.5\n\t\tseed %d\n\t}\n}\n", port, r, r+1)
	}
	ups := strings.Join(replicas, " ")
	prefix := fmt.Sprintf("lv-%d", time.Now().UnixNano()%1e9)
	systems := []struct {
		name    string
		proxies int
		policy  func(i int) string
	}{
		{"central_queue_1_proxy", 1, func(int) string {
			return "lb_policy queued_least_latency {\n\t\t\tpool lv-central\n\t\t\tlatency_threshold 1ms\n\t\t}"
		}},
		{"sluice_global_redis_least_4_proxies", 4, func(i int) string {
			return fmt.Sprintf("lb_policy global_redis_least {\n\t\t\tpool lv-redis\n\t\t\tredis %s\n\t\t\tkey_prefix %s\n\t\t\tinstance_id p%d\n\t\t}", addr, prefix, i)
		}},
		{"sluice_global_redis_queue_4_proxies", 4, func(i int) string {
			return fmt.Sprintf("lb_policy global_redis_least {\n\t\t\tpool lv-redisq\n\t\t\tredis %s\n\t\t\tkey_prefix %s-q\n\t\t\tinstance_id q%d\n\t\t\tmax_inflight 1\n\t\t\tqueue_timeout 30s\n\t\t}", addr, prefix, i)
		}},
		{"caddy_least_conn_4_proxies", 4, func(int) string { return "lb_policy least_conn" }},
		{"caddy_random_choose_2_4_proxies", 4, func(int) string { return "lb_policy random_choose 2" }},
		{"caddy_round_robin_4_proxies", 4, func(int) string { return "lb_policy round_robin" }},
		{"sluice_qll_per_proxy_4_proxies", 4, func(i int) string {
			return fmt.Sprintf("lb_policy queued_least_latency {\n\t\t\tpool lv-qll-%d\n\t\t}", i)
		}},
	}
	for si, s := range systems {
		for i := 0; i < s.proxies; i++ {
			fmt.Fprintf(&cfg, "\n:%d {\n\treverse_proxy %s {\n\t\t%s\n\t}\n}\n", 9960+10*si+i, ups, s.policy(i))
		}
	}
	startCaddy(b, cfg.String())
	for si, s := range systems {
		b.Run(s.name, func(b *testing.B) {
			lat, failed := openLoop(136, benchDuration(20*time.Second), 11, func(n int, _ *rand.Rand) *http.Request {
				url := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", 9960+10*si+n%s.proxies)
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"prompt":"remove the background"}`))
				return req
			})
			slices.Sort(lat)
			q := func(p float64) float64 { return lat[int(p*float64(len(lat)-1))].Seconds() * 1000 }
			b.ReportMetric(q(0.5), "p50_ms")
			b.ReportMetric(q(0.9), "p90_ms")
			b.ReportMetric(q(0.99), "p99_ms")
			b.ReportMetric(float64(failed), "failed")
			b.ReportMetric(float64(len(lat)), "requests")
		})
	}
}
