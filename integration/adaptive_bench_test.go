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

// BenchmarkAdaptiveSLO measures load_aware's adaptive mode: every request
// carries the same session token and session affinity is weighted 5× the
// load scorers, so without adaptation one one-at-a-time replica (100 ms)
// gets everything at 15 req/s, 1.5× its capacity; with `slo 300ms` the
// weight moves to the load scorers while the SLO is missed. The requests
// stream, and the replicas send a stream's headers with its first token
// (the SLO is a time to first token: a non-streamed answer's first byte
// is its end, and an engine that sends its headers at once, as vLLM does,
// is timed by its first token only behind a Sluice handler). Run with:
//
//	go test -run '^$' -bench AdaptiveSLO -benchtime 1x ./integration/
func BenchmarkAdaptiveSLO(b *testing.B) {
	systems := []struct{ name, slo string }{
		{"sticky_no_adaptive", ""},
		{"sticky_adaptive_slo_300ms", "slo 300ms\n\t\t\tadaptive_step 0.1"},
	}
	var cfg strings.Builder
	cfg.WriteString(globals)
	for i, s := range systems {
		port := 9800 + 10*i
		var ups []string
		for r := 1; r <= 3; r++ {
			ups = append(ups, fmt.Sprintf("127.0.0.1:%d", port+r))
			fmt.Fprintf(&cfg, "\n:%d {\n\tbind 127.0.0.1\n\tinference_sim {\n\t\tname ad-%d-%d\n\t\tconcurrency 1\n\t\tlatency fixed 100ms\n\t\tstream_headers first_token\n\t}\n}\n", port+r, i, r)
		}
		fmt.Fprintf(&cfg, `
:%d {
	reverse_proxy %s {
		lb_policy load_aware {
			pool adaptive-%d
			scorer session_affinity 5
			scorer active_request
			scorer queue
			metrics_interval 100ms
			%s
		}
	}
}
`, port, strings.Join(ups, " "), i, s.slo)
	}
	startCaddy(b, cfg.String())
	for i, s := range systems {
		b.Run(s.name, func(b *testing.B) {
			url := fmt.Sprintf("http://127.0.0.1:%d/v1/completions", 9800+10*i)
			resp, err := http.Post(url, "application/json", strings.NewReader(`{"prompt":"start"}`))
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
			token := resp.Header.Get("X-Session-Token")
			lat, failed := openLoop(15, benchDuration(10*time.Second), 3, func(int, *rand.Rand) *http.Request {
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"prompt":"`+strings.Repeat("same conversation so far. ", 8)+`","stream":true}`))
				req.Header.Set("X-Session-Token", token)
				return req
			})
			slices.Sort(lat)
			q := func(p float64) float64 { return lat[int(p*float64(len(lat)-1))].Seconds() }
			b.ReportMetric(q(0.5), "p50_s")
			b.ReportMetric(q(0.99), "p99_s")
			b.ReportMetric(float64(failed), "failed")
		})
	}
}
