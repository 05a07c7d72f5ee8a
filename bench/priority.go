package bench

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// ---- priority-overload ---------------------------------------------------

// priorityOverload is GIE flow control's second promise: under overload,
// critical traffic is served before sheddable traffic, and sheddable
// traffic is refused rather than queued without bound. Premium requests
// (x-gateway-inference-objective: premium) arrive at 12 req/s, batch ones
// at 60 req/s, over 4 one-at-a-time replicas of ~100 ms (~40 req/s): the
// pool can serve all the premium traffic and a part of the batch.
func priorityOverload(r *runner) {
	d := r.dur(10*time.Second, 2*time.Second)
	premium, batch := poisson(12, d, 31), poisson(60, d, 32)
	fleet := gieFleet("po")
	load := func(list []classArrival) func(_ []*sim.Server, proxies []string) workload {
		return func(_ []*sim.Server, proxies []string) workload {
			return workload{arrivals: arrivalTimes(list), class: func(n int) string { return list[n].class },
				build: func(n int) (*http.Request, int) {
					req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/completions", strings.NewReader(`{"prompt":"hello","max_tokens":4}`))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Gateway-Inference-Objective", list[n].class)
					req.Header.Set("X-Gateway-Inference-Fairness-Id", list[n].class)
					return req, 0
				}}
		}
	}
	both := load(mergeArrivals([]string{"premium", "batch"}, premium, batch))
	after := perClass("premium", "batch")
	flow := func(f []*sim.Server) ([]string, error) {
		return r.caddyProxies("sluice-po", 1, func(int) string {
			return fmt.Sprintf(`custom_router po {
	backends %s
}
flow_control po {
	trusted_sources 127.0.0.0/8
	objective premium 100
	objective batch -10
	max_concurrency 1
	default_ttl 5s
	band -10 {
		max_requests 40
	}
}
reverse_proxy {
	dynamic custom_router po
	lb_policy least_conn
}`, strings.Join(urls(f), " "))
		})
	}
	haproxy := func(rules ...string) func(f []*sim.Server) ([]string, error) {
		return func(f []*sim.Server) ([]string, error) { return r.haproxies("haproxy-po", 1, addrs(f), 1, rules...) }
	}
	spec := func(name, desc string, load func([]*sim.Server, []string) workload, start func([]*sim.Server) ([]string, error)) sysSpec {
		return sysSpec{name: name, desc: desc, proxies: 1, fleet: fleet, load: load, after: after, start: start}
	}
	systems := []sysSpec{
		spec("premium_alone_sluice_flow_control", "premium traffic alone (12 req/s), through Sluice flow_control",
			load(mergeArrivals([]string{"premium"}, premium)), flow),
		spec("caddy_least_conn", "premium + batch, Caddy least_conn", both, func(f []*sim.Server) ([]string, error) {
			return r.caddyProxies("caddy-po", 1, func(int) string { return staticProxy(addrs(f), "lb_policy least_conn") })
		}),
		spec("haproxy_maxconn1_fifo", "premium + batch, HAProxy leastconn, maxconn 1 per server (one FIFO queue)", both, haproxy()),
		spec("haproxy_maxconn1_priority", "premium + batch, HAProxy leastconn, maxconn 1 per server, premium queued first "+
			"(http-request set-priority-class -10 on the objective header)", both,
			haproxy("http-request set-priority-class int(-10) if { req.hdr(x-gateway-inference-objective) -m str premium }")),
		spec("sluice_flow_control", "premium + batch, Sluice flow_control (premium band 100, batch band −10 of 40 requests, "+
			"max_concurrency 1 per replica, TTL 5 s) + least_conn", both, flow),
	}
	for _, s := range systems {
		r.system(s)
	}
}
