package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// ---- multi-instance-flow -------------------------------------------------

// multiFlowScenario is flow_control behind N proxies (issue 14): with a
// local detector each instance admits the whole pool's capacity, so the
// replicas queue; with the detector's count shared through Redis the pool's
// in-flight requests stay at max_concurrency per replica while each
// instance keeps its own queues (priority, fairness).
var multiFlowScenario = scenario{
	name:  "multi-instance-flow",
	title: "flow_control on N instances: 2 and 4 proxies over 4 one-at-a-time replicas at 1.5× capacity, a quiet tenant and a flood",
	about: "4 one-at-a-time replicas of ~100 ms (lognormal σ 0.3; capacity ~38 req/s); tenant A " +
		"(X-Gateway-Inference-Fairness-Id: A) sends 4 req/s, tenant B 53 req/s (together 1.5× capacity), Poisson, 10 s, " +
		"spread round-robin over the N proxies (N = 2, 4), all from 127.0.0.1. Sluice runs `flow_control mf { " +
		"trusted_sources 127.0.0.0/8; max_concurrency 1 }` then `reverse_proxy <4 upstreams> { lb_policy least_conn }` " +
		"on every instance: with `redis` + one key_prefix (each instance holds a share of the pool's capacity in Redis, " +
		"shared by priority and tenant over every instance; queues stay local), the replica then picked by " +
		"`global_redis_least` on the same Redis (or, in the _least_conn variant, by each instance's own least_conn), or " +
		"without redis (each instance counts only its own, so N instances admit up to N × the pool's capacity). Peers: N × Caddy least_conn, N × HAProxy leastconn with maxconn 1 per server; " +
		"reference: ONE Sluice flow_control taking all the load. A alone first (per setup: through the N Redis-shared " +
		"instances, and through the one). A_vs_alone = A's p99 ÷ A's p99 alone (same rep, same N). max replica in-flight = " +
		"the most requests any replica held at once, running + waiting in its own queue (replica-side; 1 = the replicas " +
		"never queued); max pool in-flight = the most requests the 4 replicas held together (sampled every ms; 4 = the " +
		"pool's capacity); queued at a replica = requests that waited for a replica's slot, longest replica wait = the " +
		"longest such wait, replica wait = the mean time a request waited in a replica's queue (over all requests served). refused = answered, not 200. " +
		"Target with redis: max replica in-flight ≤ 1 and A_vs_alone ≤ 1.5.",
	extras: []extraCol{{"A_p50_s", "A p50", "%.3f s"}, {"A_p99_s", "A p99", "%.3f s"}, {"A_vs_alone", "A p99 vs alone", "%.2f×"},
		{"A_vs_alone_x1", "A p99 vs one-proxy alone", "%.2f×"},
		{"A_ok", "A ok", "%.0f"}, {"A_refused", "A refused", "%.0f"}, {"B_ok", "B ok", "%.0f"}, {"B_refused", "B refused", "%.0f"},
		{"max_replica_inflight", "max replica in-flight", "%.0f"},
		{"max_pool_inflight", "max pool in-flight", "%.0f"}, {"replica_queued", "queued at a replica", "%.0f"},
		{"replica_max_wait_ms", "longest replica wait", "%.0f ms"}, {"replica_wait_ms", "replica wait", "%.1f ms"}},
	run: multiFlow,
}

func multiFlow(r *runner) {
	d := r.dur(10*time.Second, 2*time.Second)
	a := poisson(4, d, 141)
	b := poisson(53, d, 142)
	fleet := gieFleet("mf")
	// The pool's peak in flight, replica-side (Σ running + queued over the
	// replicas), sampled every millisecond while the system runs.
	var poolPeak atomic.Int64
	sample := func(f []*sim.Server) func(ctx context.Context) {
		poolPeak.Store(0)
		return func(ctx context.Context) {
			tk := time.NewTicker(time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				sum := 0
				for _, srv := range f {
					st := srv.Replica().Stats()
					sum += st.Running + st.Waiting
				}
				if int64(sum) > poolPeak.Load() {
					poolPeak.Store(int64(sum))
				}
			}
		}
	}
	// Requests go round-robin over the proxies, whatever their tenant.
	load := func(list []classArrival) func(_ []*sim.Server, proxies []string) workload {
		return func(f []*sim.Server, proxies []string) workload {
			return workload{arrivals: arrivalTimes(list), class: func(n int) string { return list[n].class }, monitor: sample(f),
				build: func(n int) (*http.Request, int) {
					p := n % len(proxies)
					req, _ := http.NewRequest(http.MethodPost, proxies[p]+"/v1/completions", strings.NewReader(`{"prompt":"hello","max_tokens":4}`))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Gateway-Inference-Fairness-Id", list[n].class)
					return req, p
				}}
		}
	}
	alone, both := load(mergeArrivals([]string{"A"}, a)), load(mergeArrivals([]string{"A", "B"}, a, b))

	// A's p99 alone per setup ("x2", "x4", "x1"), from the same rep.
	aloneP99 := map[string]float64{}
	perTenant := perClass("A", "B")
	measure := func(setup string, isAlone bool) func(f []*sim.Server, recs []Record, s *Summary) {
		return func(f []*sim.Server, recs []Record, s *Summary) {
			perTenant(f, recs, s)
			replicaSide(f, s)
			s.Extra["max_pool_inflight"] = float64(poolPeak.Load())
			s.Notes = append(s.Notes, proxyLogNotes(r.procs.snapshotLogs())...)
			p, ok := s.Extra["A_p99_s"]
			if !ok {
				return
			}
			if isAlone {
				aloneP99[setup] = p
			}
			if aloneP99[setup] > 0 {
				s.Extra["A_vs_alone"] = p / aloneP99[setup]
			}
			if aloneP99["x1"] > 0 {
				s.Extra["A_vs_alone_x1"] = p / aloneP99["x1"]
			}
		}
	}

	// The same flow_control on every instance; with Redis, one key_prefix
	// per system and rep (no count left over by an earlier system).
	runID := time.Now().UnixNano() % 1e9
	// With Redis, the replica is picked by global_redis_least on the same
	// Redis (each instance's least_conn sees only its own requests, so two
	// instances would pick one replica while another idles), unless
	// policy names another.
	flowWith := func(name string, n int, shared bool, policy string) func(f []*sim.Server) ([]string, error) {
		return func(f []*sim.Server) ([]string, error) {
			redis := ""
			if shared {
				addr, err := r.redisAddr()
				if err != nil {
					return nil, fmt.Errorf("%w: %v", errSkipped, err)
				}
				prefix := fmt.Sprintf("bench-mf-%d-%s-r%d", runID, name, r.rep)
				redis = fmt.Sprintf("\tredis %s\n\tkey_prefix %s\n", addr, prefix)
				if policy == "" {
					policy = fmt.Sprintf("lb_policy global_redis_least {\n\tpool mf\n\tredis %s\n\tkey_prefix %s\n}", addr, prefix)
				}
			}
			if policy == "" {
				policy = "lb_policy least_conn"
			}
			return r.caddyProxies("sluice-mf", n, func(int) string {
				return "flow_control mf {\n\ttrusted_sources 127.0.0.0/8\n\tmax_concurrency 1\n" + redis + "}\n" +
					staticProxy(addrs(f), policy)
			})
		}
	}
	flow := func(name string, n int, shared bool) func(f []*sim.Server) ([]string, error) {
		return flowWith(name, n, shared, "")
	}
	spec := func(name, desc, setup string, n int, isAlone bool, load func([]*sim.Server, []string) workload,
		start func([]*sim.Server) ([]string, error)) sysSpec {
		return sysSpec{name: name, desc: desc, proxies: n, fleet: fleet, load: load, after: measure(setup, isAlone), start: start}
	}

	// The one-proxy reference first: its A alone is every system's second
	// baseline (A_vs_alone_x1).
	systems := []sysSpec{
		spec("A_alone_central_sluice_flow", "tenant A alone (4 req/s) through ONE Sluice flow_control", "x1", 1, true, alone,
			flow("A_alone_central_sluice_flow", 1, false)),
		spec("central_sluice_flow", "reference: A + B through ONE Sluice flow_control (max_concurrency 1) + least_conn", "x1", 1, false, both,
			flow("central_sluice_flow", 1, false)),
	}
	for _, n := range []int{2, 4} {
		x := fmt.Sprintf("x%d", n)
		name := func(s string) string { return s + "_" + x }
		systems = append(systems,
			spec(name("A_alone_sluice_flow_redis"), fmt.Sprintf("tenant A alone (4 req/s) through %d Sluice flow_control sharing the count through Redis", n),
				x, n, true, alone, flow(name("A_alone_sluice_flow_redis"), n, true)),
			spec(name("sluice_flow_redis"), fmt.Sprintf("A + B, %d Sluice flow_control (max_concurrency 1) sharing the capacity through one Redis + global_redis_least on it", n),
				x, n, false, both, flow(name("sluice_flow_redis"), n, true)),
			spec(name("sluice_flow_redis_least_conn"), fmt.Sprintf("A + B, %d Sluice flow_control (max_concurrency 1) sharing the capacity through Redis + each instance's own least_conn", n),
				x, n, false, both, flowWith(name("sluice_flow_redis_least_conn"), n, true, "lb_policy least_conn")),
			spec(name("sluice_flow_local"), fmt.Sprintf("A + B, %d Sluice flow_control (max_concurrency 1) + least_conn, no redis: each instance counts only its own requests", n),
				x, n, false, both, flow(name("sluice_flow_local"), n, false)),
			spec(name("caddy_least_conn"), fmt.Sprintf("A + B, %d Caddy least_conn, no flow control", n), x, n, false, both,
				func(f []*sim.Server) ([]string, error) {
					return r.caddyProxies("caddy-mf", n, func(int) string { return staticProxy(addrs(f), "lb_policy least_conn") })
				}),
			spec(name("haproxy_leastconn_maxconn1"), fmt.Sprintf("A + B, %d HAProxy leastconn, maxconn 1 per server in each (a FIFO queue per HAProxy)", n),
				x, n, false, both, func(f []*sim.Server) ([]string, error) { return r.haproxies("haproxy-mf", n, addrs(f), 1) }),
		)
	}
	for _, s := range systems {
		r.system(s)
	}
}

// replicaSide adds, from the replicas' own counters, max_replica_inflight
// (the most requests one replica held at once, running + queued),
// replica_queued (requests that waited for a replica's slot),
// replica_max_wait_ms (the longest such wait) and replica_wait_ms (mean
// time in a replica's queue per request started), and a note with each
// replica's peak.
func replicaSide(f []*sim.Server, s *Summary) {
	peak, started, queued := 0, uint64(0), uint64(0)
	var wait, maxWait time.Duration
	var each []string
	for _, srv := range f {
		st := srv.Replica().Stats()
		peak = max(peak, st.MaxInFlight)
		started += st.Started
		queued += st.Queued
		wait += st.QueueWait
		maxWait = max(maxWait, st.MaxQueueWait)
		each = append(each, fmt.Sprintf("%d", st.MaxInFlight))
	}
	s.Extra["max_replica_inflight"] = float64(peak)
	s.Extra["replica_queued"] = float64(queued)
	s.Extra["replica_max_wait_ms"] = float64(maxWait) / float64(time.Millisecond)
	if started > 0 {
		s.Extra["replica_wait_ms"] = float64(wait) / float64(started) / float64(time.Millisecond)
	}
	s.Notes = append(s.Notes, "replica peaks in-flight (running + queued): "+strings.Join(each, "/"))
}

// startupWarnings are the warnings every Caddy of the harness logs at start
// (admin off, plain HTTP): not worth a note.
var startupWarnings = []string{"admin endpoint disabled", "HTTP/2 skipped because it requires TLS", "HTTP/3 skipped because it requires TLS"}

// proxyLogNotes summarises the Caddy instances' logs (level WARN and up):
// how many lines, and the distinct messages (at most 3).
func proxyLogNotes(logs []string) []string {
	lines := 0
	var msgs []string
	for _, path := range logs {
		if !strings.Contains(path, "sluice-mf") {
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			if !strings.Contains(l, `"level":"warn"`) && !strings.Contains(l, `"level":"error"`) && !strings.Contains(l, "panic") {
				continue
			}
			m := l
			if _, rest, ok := strings.Cut(l, `"msg":"`); ok {
				m, _, _ = strings.Cut(rest, `"`)
			}
			if slices.Contains(startupWarnings, m) {
				continue
			}
			lines++
			if len(m) > 160 {
				m = m[:160] + "…"
			}
			if !slices.Contains(msgs, m) && len(msgs) < 3 {
				msgs = append(msgs, m)
			}
		}
		f.Close()
	}
	if lines == 0 {
		return nil
	}
	return []string{fmt.Sprintf("proxy logs: %d warn/error lines (%s)", lines, strings.Join(msgs, "; "))}
}
