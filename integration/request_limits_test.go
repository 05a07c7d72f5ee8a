package integration

import (
	"testing"
)

// TestQLLWaitsForReplicasAtCaddysRequestLimit: Caddy's passive health
// `unhealthy_request_count` (max_requests in JSON) makes an upstream
// "full", not down. queued_least_latency must queue for a full replica and
// send the request when it frees, never fail the queue with backends_down
// (it answered 200 200 503 503 503 503 here).
func TestQLLWaitsForReplicasAtCaddysRequestLimit(t *testing.T) {
	for name, cfg := range map[string]string{
		"static upstreams": `
:9360 {
	reverse_proxy 127.0.0.1:9361 127.0.0.1:9362 {
		lb_policy queued_least_latency {
			pool limits-static
		}
		unhealthy_request_count 1
	}
}
`,
		"dynamic upstreams": `
:9360 {
	custom_router limits-dynamic
	reverse_proxy {
		dynamic custom_router limits-dynamic
		lb_policy queued_least_latency {
			pool limits-dynamic
		}
		unhealthy_request_count 1
	}
}
`,
	} {
		t.Run(name, func(t *testing.T) {
			startCaddy(t, globals+cfg+sims(9361, 9362))
			url := "http://127.0.0.1:9360"
			if name == "dynamic upstreams" {
				setBackends(t, url, "http://127.0.0.1:9361", "http://127.0.0.1:9362")
			}
			const n = 6
			served := map[string]int{}
			for o := range burst(url, n) {
				if o.err != nil || o.status != 200 {
					t.Fatalf("request answered %+v: a replica at its request limit is busy, not down", o)
				}
				served[o.replica]++
			}
			if served["sim-9361"] == 0 || served["sim-9362"] == 0 || served["sim-9361"]+served["sim-9362"] != n {
				t.Fatalf("served %v, want %d over both replicas", served, n)
			}
		})
	}
}
