package bench

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// ---- flow-new-user -------------------------------------------------------

// flowNewUserScenario is flow_control as a new user writes it: static
// upstreams in reverse_proxy (no custom_router, no managed backend set),
// trusted_sources, max_concurrency 1, no band — defaults only — while one
// tenant floods at twice the pool's capacity.
var flowNewUserScenario = scenario{
	name:  "flow-new-user",
	title: "flow_control as a new user writes it: static upstreams, max_concurrency 1, no band; a tenant flooding at 2× capacity",
	about: "4 one-at-a-time replicas of ~100 ms (lognormal σ 0.3; capacity ~38 req/s) behind one proxy; tenant A " +
		"(X-Gateway-Inference-Fairness-Id: A) sends 4 req/s, tenant B 80 req/s (2× capacity), Poisson, 10 s; first A alone. " +
		"Sluice runs the obvious configuration and nothing else: `flow_control { trusted_sources 127.0.0.0/8; " +
		"max_concurrency 1 }` then `reverse_proxy <4 upstreams>` (Caddy's default policy, or the lb_policy named), " +
		"no custom_router, no band, every other option at its default. A_vs_alone = A's p99 ÷ A's p99 alone (same rep). " +
		"refused = answered, not 200.",
	extras: []extraCol{{"A_p50_s", "A p50", "%.3f s"}, {"A_p99_s", "A p99", "%.3f s"}, {"A_vs_alone", "A p99 vs alone", "%.2f×"},
		{"A_ok", "A ok", "%.0f"}, {"A_refused", "A refused", "%.0f"}, {"B_ok", "B ok", "%.0f"}, {"B_refused", "B refused", "%.0f"},
		{"B_p99_s", "B p99", "%.3f s"}},
	run: flowNewUser,
}

func flowNewUser(r *runner) {
	d := r.dur(10*time.Second, 2*time.Second)
	a := poisson(4, d, 41)
	b := poisson(80, d, 42)
	fleet := gieFleet("nu")
	load := func(list []classArrival) func(_ []*sim.Server, proxies []string) workload {
		return func(_ []*sim.Server, proxies []string) workload {
			return workload{arrivals: arrivalTimes(list), class: func(n int) string { return list[n].class },
				build: func(n int) (*http.Request, int) {
					req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/completions", strings.NewReader(`{"prompt":"hello","max_tokens":4}`))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Gateway-Inference-Fairness-Id", list[n].class)
					return req, 0
				}}
		}
	}
	alone, both := load(mergeArrivals([]string{"A"}, a)), load(mergeArrivals([]string{"A", "B"}, a, b))
	// A's p99 alone, from the first system of the same rep.
	var aloneP99 float64
	perTenant := perClass("A", "B")
	after := func(f []*sim.Server, recs []Record, s *Summary) {
		perTenant(f, recs, s)
		if p, ok := s.Extra["A_p99_s"]; ok && aloneP99 > 0 {
			s.Extra["A_vs_alone"] = p / aloneP99
		}
	}
	// The obvious configuration: nothing but the tenant header's source
	// and the replicas' concurrency.
	flow := func(policy string) func(f []*sim.Server) ([]string, error) {
		return func(f []*sim.Server) ([]string, error) {
			return r.caddyProxies("sluice-nu", 1, func(int) string {
				return "flow_control {\n\ttrusted_sources 127.0.0.0/8\n\tmax_concurrency 1\n}\n" + staticProxy(addrs(f), policy)
			})
		}
	}
	caddy := func(name, policy string) func(f []*sim.Server) ([]string, error) {
		return func(f []*sim.Server) ([]string, error) {
			return r.caddyProxies(name, 1, func(int) string { return staticProxy(addrs(f), policy) })
		}
	}
	spec := func(name, desc string, load func([]*sim.Server, []string) workload, start func([]*sim.Server) ([]string, error)) sysSpec {
		return sysSpec{name: name, desc: desc, proxies: 1, fleet: fleet, load: load, after: after, start: start}
	}
	systems := []sysSpec{
		spec("A_alone_sluice_flow_control", "tenant A alone (4 req/s), through Sluice flow_control, obvious config", alone, flow("")),
		spec("caddy_round_robin", "A + B flood, Caddy round_robin, no flow control", both, caddy("caddy-rr", "lb_policy round_robin")),
		spec("caddy_least_conn", "A + B flood, Caddy least_conn, no flow control", both, caddy("caddy-lc", "lb_policy least_conn")),
		spec("haproxy_leastconn_maxconn1", "A + B flood, HAProxy leastconn, maxconn 1 per server (one FIFO queue)", both,
			func(f []*sim.Server) ([]string, error) { return r.haproxies("haproxy-nu", 1, addrs(f), 1) }),
		spec("sluice_flow_control", "A + B flood, Sluice flow_control obvious config, reverse_proxy's default policy (random)",
			both, flow("")),
		spec("sluice_flow_control_least_conn", "A + B flood, Sluice flow_control obvious config, lb_policy least_conn",
			both, flow("lb_policy least_conn")),
		spec("sluice_flow_control_qll", "A + B flood, Sluice flow_control obvious config, lb_policy queued_least_latency (defaults)",
			both, flow("lb_policy queued_least_latency")),
	}
	for i, s := range systems {
		if i == 0 {
			inner := s.after
			s.after = func(f []*sim.Server, recs []Record, sum *Summary) {
				inner(f, recs, sum)
				aloneP99 = sum.Extra["A_p99_s"]
				sum.Extra["A_vs_alone"] = 1
			}
		}
		r.system(s)
	}
}

// gieFleet is the flow-control scenarios' pool: 4 one-at-a-time replicas
// of ~100 ms (lognormal σ 0.3; capacity ~38–40 req/s), named <prefix>-<i>.
func gieFleet(prefix string) []sim.Config {
	fleet := make([]sim.Config, 4)
	for i := range fleet {
		fleet[i] = sim.Config{Name: fmt.Sprintf("%s-%d", prefix, i), Concurrency: 1,
			Latency: sim.Latency{Kind: sim.LatencyLognormal, Duration: 100 * time.Millisecond, Sigma: 0.3},
			Seed:    uint64(i + 1)}
	}
	return fleet
}
