package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/sim"
)

// ---- chaos -------------------------------------------------------------
//
// Every Sluice policy under faults at once: 10% of the clients give up
// mid-queue or mid-stream, replicas are killed and restarted, the backend
// set churns every second, hot reloads land every few seconds (good ones
// and refused ones; every other good reload of a Redis-backed system
// changes a connection setting, which builds new shared state), Redis is
// frozen, killed and restarted empty, then restarted from a snapshot
// taken a tenth of the run earlier (the records go back in time, as after
// a restore), then fails over to a replica frozen while the primary took
// writes (promoted, the Redis address moving to it as a virtual IP
// would: bench/failover.go), and the instances
// of a pool are given different backend sets. After the drain, every
// counter Sluice keeps (in-flight, queues, Redis sorted sets, queue,
// waiters, records; flow-control in flight and queued) must be back to 0,
// every request not given up must have had an answer, and no proxy may
// have logged a panic. Extras: leaked (sum of counters not back to 0),
// panics, cancelled (by the client, on purpose).

const (
	chaosReplicas = 4
	chaosRate     = 250.0 // req/s
	chaosCancel   = 0.10  // share of requests the client abandons
)

func chaos(r *runner) {
	n := 10000
	if r.opt.Quick {
		n = 1500
	}
	d := time.Duration(float64(n) / chaosRate * float64(time.Second))
	arrivals := poisson(chaosRate, d, 41)
	fleet := make([]sim.Config, chaosReplicas)
	for i := range fleet {
		fleet[i] = sim.Config{Name: fmt.Sprintf("chaos-%d", i), Concurrency: 4,
			Latency: sim.Latency{Kind: sim.LatencyLognormal, Duration: 15 * time.Millisecond, Sigma: 0.5},
			Seed:    uint64(i + 1)}
	}
	type chaosSystem struct {
		name, desc string
		instances  int
		redis      bool
		// block is the site's Sluice part for a pool; bad makes the reload
		// Caddy must refuse.
		block func(pool, redis string, variant int) string
		bad   string
	}
	policy := func(p string) func(pool, redis string, v int) string {
		return func(pool, redis string, v int) string {
			return fmt.Sprintf("custom_router %s\nreverse_proxy {\n\tdynamic custom_router %s\n\tlb_policy %s {\n\t\tpool %s\n%s\t\t# chaos-bad\n\t}\n}",
				pool, pool, strings.Fields(p)[0], pool, policyOptions(p, redis, v))
		}
	}
	systems := []chaosSystem{
		{name: "sluice_qll", desc: "queued_least_latency", instances: 1, block: policy("queued_least_latency"), bad: "latency_measure bogus"},
		{name: "sluice_cache_aware", desc: "cache_aware", instances: 1, block: policy("cache_aware"), bad: "fail_duration -5s"},
		{name: "sluice_load_aware", desc: "load_aware", instances: 1, block: policy("load_aware"), bad: "fail_duration -5s"},
		{name: "sluice_global_redis_least_x2", desc: "global_redis_least, 2 instances", instances: 2, redis: true,
			block: policy("global_redis_least"), bad: "breaker_backoff -1s"},
		{name: "sluice_global_redis_queue_x2", desc: "global_redis_least queueing mode, 2 instances", instances: 2, redis: true,
			block: policy("global_redis_least queue"), bad: "breaker_backoff -1s"},
		{name: "sluice_global_redis_batched_x2", desc: "global_redis_least without max_inflight, 2 instances, beyond call_rate (view picks, batches)", instances: 2, redis: true,
			block: policy("global_redis_least batched"), bad: "call_rate -5"},
		{name: "sluice_flow_control_qll", desc: "flow_control in front of queued_least_latency", instances: 1,
			block: func(pool, redis string, v int) string {
				return fmt.Sprintf("custom_router %s\nflow_control %s {\n\ttrusted_sources 127.0.0.0/8\n\tmax_concurrency %d\n\tdefault_ttl 2s\n\tband 0 {\n\t\tmax_requests 200\n\t}\n\t# chaos-bad-flow\n}\n", pool, pool, 3+v) +
					strings.Replace(policy("queued_least_latency")(pool, redis, v), "# chaos-bad", "", 1)
			}, bad: "max_concurrency -4"},
		{name: "sluice_flow_control_redis_x2", desc: "flow_control sharing the pool's capacity through Redis, 2 instances, in front of queued_least_latency", instances: 2, redis: true,
			block: func(pool, redis string, v int) string {
				return fmt.Sprintf("custom_router %s\nflow_control %s {\n\ttrusted_sources 127.0.0.0/8\n\tmax_concurrency %d\n\tdefault_ttl 2s\n\tredis %s\n\tkey_prefix chaos-flow\n\tdial_timeout %s\n\tlease_ttl 1s\n\tband 0 {\n\t\tmax_requests 200\n\t}\n\t# chaos-bad-flow\n}\n", pool, pool, 3+v, redis, dialTimeout(v)) +
					strings.Replace(policy("queued_least_latency")(pool, redis, v), "# chaos-bad", "", 1)
			}, bad: "fallback_share 2"},
	}
	for _, cs := range systems {
		cs := cs
		pool := "chaos"
		var redisAddr string
		// front is the address the Redis-backed systems use: a forwarder
		// that moves to a promoted replica at failover.
		var front *tcpFront
		var fo failover
		var admins, sites []string
		var ports []int
		variant := 0
		siteFor := func(v int, bad bool) string {
			// The invalid option goes last in its block, after any valid
			// line it could otherwise be overridden by.
			b := cs.block(pool, redisAddr, v)
			if bad {
				b = strings.Replace(strings.Replace(b, "# chaos-bad-flow", cs.bad, 1), "# chaos-bad", cs.bad, 1)
			}
			return b
		}
		spec := sysSpec{name: cs.name, desc: "chaos: " + cs.desc, proxies: cs.instances, fleet: fleet, reqTimeout: 30 * time.Second}
		spec.start = func(f []*sim.Server) ([]string, error) {
			if cs.redis {
				a, err := r.redisAddr()
				if err != nil {
					return nil, skipped(err.Error())
				}
				if front, err = startTCPFront(a); err != nil {
					return nil, err
				}
				redisAddr = front.Addr()
			}
			var err error
			ports, err = freePorts(2 * cs.instances)
			if err != nil {
				return nil, err
			}
			var out []string
			for i := range cs.instances {
				admin := fmt.Sprintf("127.0.0.1:%d", ports[cs.instances+i])
				u, err := r.startCaddy(fmt.Sprintf("%s-%d", cs.name, i), ports[i], admin, siteFor(0, false))
				if err != nil {
					return nil, err
				}
				out = append(out, u)
				admins = append(admins, "http://"+admin)
				sites = append(sites, u)
			}
			for _, u := range out {
				if err := setBackendsAt(r.ctx, u, urls(f)); err != nil {
					return nil, err
				}
			}
			return out, nil
		}
		spec.load = func(f []*sim.Server, proxies []string) workload {
			rng := rand.New(rand.NewPCG(7, 7))
			cancelAt := make([]time.Duration, len(arrivals))
			for i := range cancelAt {
				if rng.Float64() < chaosCancel {
					cancelAt[i] = time.Duration(rng.IntN(60)+1) * time.Millisecond // mid-queue or mid-stream
				}
			}
			var acts []action
			addrOf := addrs(f)
			// Set-backends churn every second: 3 of the 4 replicas, rotating,
			// and a different 3 at each instance of the pool (instances
			// disagree for as long as a set-backends takes to reach them all).
			for i, at := 0, time.Second; at < d; i, at = i+1, at+time.Second {
				i := i
				acts = append(acts, action{at: at, do: func(ctx context.Context) error {
					for k, u := range sites {
						set := make([]string, 0, chaosReplicas-1)
						for j := range chaosReplicas {
							if j != (i+k)%chaosReplicas {
								set = append(set, f[j].URL())
							}
						}
						if err := setBackendsAt(ctx, u, set); err != nil {
							return err
						}
					}
					return nil
				}})
			}
			// Hot reloads every 2.5 s, good and refused in turn; every other
			// refused one adds a second site that gives the pool other
			// upstreams (two sites on one pool).
			for i, at := 0, 2500*time.Millisecond; at < d; i, at = i+1, at+2500*time.Millisecond {
				bad, twoSites := i%2 == 1, i%4 == 1
				acts = append(acts, action{at: at, do: func(ctx context.Context) error {
					if !bad {
						variant++
					}
					for k, a := range admins {
						cfg := caddyfile(ports[k], strings.TrimPrefix(a, "http://"), siteFor(variant, bad && !twoSites))
						what := cs.bad
						if twoSites {
							cfg += secondSiteOnPool(pool)
							what = "a second site on the pool"
						}
						status, msg, err := loadCaddyfile(ctx, a, cfg)
						switch {
						case err != nil:
							return err
						case bad && status == 200:
							return fmt.Errorf("a config with %s was accepted", what)
						case !bad && status != 200:
							return fmt.Errorf("a good reload was refused: %d %s", status, msg)
						}
					}
					return nil
				}})
			}
			// A replica killed every 3 s, back 1 s later on the same address.
			for i, at := 0, 1500*time.Millisecond; at+time.Second < d; i, at = i+1, at+3*time.Second {
				k := (i + 1) % chaosReplicas
				acts = append(acts, action{at: at, do: func(context.Context) error { f[k].Close(); return nil }},
					action{at: at + time.Second, do: func(context.Context) error {
						s, err := sim.StartOn(addrOf[k], fleet[k])
						if err == nil {
							f[k] = s
						}
						return err
					}})
			}
			if cs.redis {
				acts = append(acts,
					action{at: d * 3 / 10, do: func(context.Context) error { return r.signalRedis(syscall.SIGSTOP) }},
					action{at: d*3/10 + 1500*time.Millisecond, do: func(context.Context) error { return r.signalRedis(syscall.SIGCONT) }},
					action{at: d * 6 / 10, do: func(context.Context) error { return r.restartRedis(false) }},
					action{at: d * 7 / 10, do: func(ctx context.Context) error { return r.snapshotRedis(ctx) }},
					action{at: d * 8 / 10, do: func(context.Context) error { return r.restartRedis(true) }},
					// A replica that lags (frozen while the primary takes
					// writes) is promoted, and the front moves to it.
					action{at: d * 85 / 100, do: func(ctx context.Context) error { return fo.run(ctx, r, front, d/20) }})
			}
			return workload{arrivals: arrivals, actions: acts,
				class: func(n int) string {
					if cancelAt[n] > 0 {
						return "cancel"
					}
					return "keep"
				},
				build: func(n int) (*http.Request, int) {
					stream := n%3 == 0
					body := fmt.Sprintf(`{"model":"m","prompt":"chaos %d: %s","max_tokens":%d,"stream":%t}`,
						n, strings.Repeat("ab ", n%50), 4+n%8, stream)
					ctx := context.Background()
					if cancelAt[n] > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, cancelAt[n])
						time.AfterFunc(cancelAt[n], cancel) // the deadline is the point; release its timer with it
					}
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, proxies[n%len(proxies)]+"/v1/completions", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Gateway-Inference-Fairness-Id", fmt.Sprintf("tenant-%d", n%5))
					// Like OpenAI's SDKs, the client retries a request the
					// server closed the connection on before reading it: a
					// reload closes the old server's idle keep-alive
					// connections, and HTTP/1.1 has no way to say so first.
					// Go's transport retries exactly those when the request is
					// marked replayable.
					req.Header.Set("Idempotency-Key", fmt.Sprintf("chaos-%d", n))
					return req, n % len(proxies)
				}}
		}
		// A request its client abandoned on purpose is not lost.
		spec.abandoned = func(rec Record) bool { return rec.Class == "cancel" }
		spec.after = func(f []*sim.Server, recs []Record, s *Summary) {
			if s.Extra == nil {
				s.Extra = map[string]float64{}
			}
			cancelled := 0
			for _, rec := range recs {
				if rec.Class == "cancel" && (rec.Status == 0 || rec.Err != "") {
					cancelled++
				}
			}
			leaked, notes := drainedCounters(r.ctx, sites, redisAddr, pool)
			if front != nil {
				if err := fo.restore(r); err != nil {
					r.res.Failures = append(r.res.Failures, fmt.Sprintf("%s: restoring Redis after the failover: %v", cs.name, err))
				}
				front.Close()
			}
			s.Notes = append(s.Notes, notes...)
			panics := 0
			for _, p := range r.procs.snapshotLogs() {
				panics += countPanics(p)
			}
			if s.Lost > 0 {
				// What the proxies said about failures, for the one
				// reading a failed run: a lost request is rare and the
				// logs go with the run's temporary directory.
				for _, p := range r.procs.snapshotLogs() {
					for _, line := range lastLogErrors(p, 12) {
						fmt.Fprintf(r.log, "   %s: %s\n", filepath.Base(p), line)
					}
				}
			}
			s.Extra["cancelled"] = float64(cancelled)
			s.Extra["leaked"] = float64(leaked)
			s.Extra["panics"] = float64(panics)
			if leaked > 0 || panics > 0 {
				r.res.Failures = append(r.res.Failures, fmt.Sprintf("%s: leaked %d, panics %d (%s)", cs.name, leaked, panics, strings.Join(notes, "; ")))
			}
		}
		r.system(spec)
	}
}

// policyOptions are the lines of a policy block for the chaos run;
// variant changes a setting a good reload applies.
func policyOptions(p, redis string, v int) string {
	switch {
	case strings.HasPrefix(p, "queued_least_latency"):
		return fmt.Sprintf("\t\tparallelism %d\n\t\tstate_log_interval -1\n\t\tfail_duration 1s\n", 4+v%2)
	case strings.HasPrefix(p, "cache_aware"):
		return fmt.Sprintf("\t\tcache_threshold 0.%d\n\t\tfail_duration 1s\n", 4+v%2)
	case strings.HasPrefix(p, "load_aware"):
		return fmt.Sprintf("\t\tscorer active_request\n\t\tscorer active_tokens\n\t\tmetrics_interval %dms\n\t\tfail_duration 1s\n", 200+100*(v%2))
	case strings.HasSuffix(p, "batched"):
		// ~125 req/s per instance against 20-21 calls a second: most picks
		// come from the view and go to Redis in batches.
		return fmt.Sprintf("\t\tredis %s\n\t\tkey_prefix chaos-batched\n\t\tdial_timeout %s\n\t\tcall_rate %d\n\t\tlease_ttl 1s\n\t\tbreaker_backoff 200ms\n", redis, dialTimeout(v), 20+v%2)
	case strings.HasSuffix(p, "queue"):
		return fmt.Sprintf("\t\tredis %s\n\t\tkey_prefix chaos-queue\n\t\tdial_timeout %s\n\t\tmax_inflight %d\n\t\tqueue_timeout 10s\n\t\tlease_ttl 1s\n\t\tbreaker_backoff 200ms\n", redis, dialTimeout(v), 4+v%2)
	default:
		return fmt.Sprintf("\t\tredis %s\n\t\tkey_prefix chaos-least\n\t\tdial_timeout %s\n\t\tmax_inflight %d\n\t\tlease_ttl 1s\n\t\tbreaker_backoff 200ms\n", redis, dialTimeout(v), 40+v%2)
	}
}

// secondSiteOnPool is a site whose reverse_proxy gives pool static
// upstreams of its own: with the chaos site's backend set, two lists for
// one pool, which Caddy must refuse to load.
func secondSiteOnPool(pool string) string {
	return fmt.Sprintf(`
http://127.0.0.2:1 {
	reverse_proxy 127.0.0.1:1 127.0.0.1:2 {
		lb_policy queued_least_latency {
			pool %s
		}
	}
}
`, pool)
}

// dialTimeout is a Redis connection setting that changes on every other
// good reload (variant): such a reload replaces the pool's shared state
// with one on a new connection while requests run.
func dialTimeout(v int) string { return fmt.Sprintf("%ds", 1+(v/2)%2) }

func setBackendsAt(ctx context.Context, site string, backends []string) error {
	b, _ := json.Marshal(map[string][]string{"backends": backends})
	return post(ctx, site+"/_custom_router/set-backends", "application/json", string(b))
}

// loadCaddyfile posts a Caddyfile to a Caddy admin endpoint's /load.
func loadCaddyfile(ctx context.Context, admin, cfg string) (int, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, admin+"/load", strings.NewReader(cfg))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	http.DefaultClient.CloseIdleConnections()
	return resp.StatusCode, strings.TrimSpace(string(msg)), nil
}

// drainedCounters waits (bounded) until every counter Sluice keeps is 0
// and returns what is left: the sum, and a note per non-zero counter.
func drainedCounters(ctx context.Context, sites []string, redisAddr, pool string) (int, []string) {
	var left int
	var notes []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		left, notes = 0, nil
		for _, site := range sites {
			n, why := siteCounters(ctx, site)
			left += n
			notes = append(notes, why...)
		}
		if redisAddr != "" {
			n, why := redisCounters(ctx, redisAddr)
			left += n
			notes = append(notes, why...)
		}
		if left == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return left, notes
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// siteCounters reads one proxy's health (queue depth, in flight per
// backend) and its flow-control gauges.
func siteCounters(ctx context.Context, site string) (int, []string) {
	var h struct {
		QueueDepth int `json:"queue_depth"`
		Backends   []struct {
			Addr     string `json:"addr"`
			InFlight int    `json:"in_flight"`
		} `json:"backends"`
	}
	var notes []string
	total := 0
	if err := getJSON(ctx, site+"/_custom_router/health", &h); err != nil {
		return 1, []string{site + ": health: " + err.Error()}
	}
	if h.QueueDepth != 0 {
		total += h.QueueDepth
		notes = append(notes, fmt.Sprintf("%s: queue_depth %d", site, h.QueueDepth))
	}
	for _, b := range h.Backends {
		if b.InFlight != 0 {
			total += b.InFlight
			notes = append(notes, fmt.Sprintf("%s: %s in_flight %d", site, b.Addr, b.InFlight))
		}
	}
	metrics, err := getText(ctx, site+"/_custom_router/metrics")
	if err != nil {
		return total + 1, append(notes, site+": metrics: "+err.Error())
	}
	for _, name := range []string{"sluice_flow_control_inflight_requests", "inference_extension_flow_control_queue_size", "inference_extension_flow_control_queue_bytes"} {
		if v := sumMetric(metrics, name); v != 0 {
			total += int(v)
			notes = append(notes, fmt.Sprintf("%s: %s %g", site, name, v))
		}
	}
	return total, notes
}

// redisCounters sums every counter Sluice keeps in Redis: sorted-set
// scores (in-flight counts, removed-but-busy replicas), queue lengths and
// hash sizes (waiters, assigned slots, per-instance request records).
func redisCounters(ctx context.Context, addr string) (int, []string) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		return 1, []string{"redis: " + err.Error()}
	}
	defer c.Close()
	keys, err := c.Do(ctx, c.B().Keys().Pattern("{sluice:chaos-*").Build()).AsStrSlice()
	if err != nil {
		return 1, []string{"redis keys: " + err.Error()}
	}
	total := 0
	var notes []string
	lapsed, err := gateLapsedInstances(ctx, c, keys)
	if err != nil {
		return 1, []string{"redis: " + err.Error()}
	}
	for _, k := range keys {
		if strings.HasSuffix(k, ":picks") || strings.HasSuffix(k, ":flow:meta") {
			continue // global_redis_least's pick counter, the flow gate's record identity: not counts in flight
		}
		if gate, ok := strings.CutSuffix(k, ":flow:held"); ok {
			n, why := gateHeld(ctx, c, k, lapsed[gate])
			total += n
			notes = append(notes, why...)
			continue
		}
		if strings.HasSuffix(k, ":flow:live") || strings.HasSuffix(k, ":flow:since") || strings.HasSuffix(k, ":flow:want") {
			// Lease expiries, grant times and demand lines: what a gate
			// instance holds is in :flow:held, counted above.
			continue
		}
		typ, _ := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
		n := 0
		switch typ {
		case "zset":
			zs, _ := c.Do(ctx, c.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
			for _, z := range zs {
				n += int(z.Score)
			}
		case "list":
			l, _ := c.Do(ctx, c.B().Llen().Key(k).Build()).AsInt64()
			n = int(l)
		case "hash":
			// A record naming a replica is a request in flight; an empty
			// one is the tombstone of a select that timed out (it keeps a
			// late execution of that select from taking a slot) and holds
			// nothing.
			// Fields "#" (the instance's last batch number) and "!" (its
			// version, raised when it reconciles) are not requests.
			kv, _ := c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
			for f, v := range kv {
				if f != "#" && f != "!" && v != "" {
					n++
				}
			}
		}
		if n != 0 {
			total += n
			notes = append(notes, fmt.Sprintf("redis %s (%s) %d", k, typ, n))
		}
	}
	return total, notes
}

// gateLapsedInstances returns, per flow gate (key prefix before
// ":flow:"), the instances whose lease in ":flow:live" ran out by Redis's
// clock. Their records hold nothing: the claim script reaps them before it
// counts anything, at the next claim. They are left behind when Redis goes
// back in time (a failover to a replica that lagged brings back the record
// of an instance that had left) and no instance claims again afterwards.
func gateLapsedInstances(ctx context.Context, c rueidis.Client, keys []string) (map[string]map[string]bool, error) {
	t, err := c.Do(ctx, c.B().Time().Build()).AsStrSlice()
	if err != nil || len(t) != 2 {
		return nil, fmt.Errorf("TIME: %v", err)
	}
	sec, _ := strconv.ParseInt(t[0], 10, 64)
	usec, _ := strconv.ParseInt(t[1], 10, 64)
	now := float64(sec*1000 + usec/1000)
	out := map[string]map[string]bool{}
	for _, k := range keys {
		gate, ok := strings.CutSuffix(k, ":flow:live")
		if !ok {
			continue
		}
		zs, err := c.Do(ctx, c.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
		if err != nil {
			return nil, fmt.Errorf("%s: %v", k, err)
		}
		for _, z := range zs {
			if z.Score <= now {
				if out[gate] == nil {
					out[gate] = map[string]bool{}
				}
				out[gate][z.Member] = true
			}
		}
	}
	return out, nil
}

// gateHeld counts the units the flow gate's instances hold, leaving out
// instances whose lease has lapsed (noted, not counted). An instance with
// no lease at all holding units is counted: nothing would ever reap it.
func gateHeld(ctx context.Context, c rueidis.Client, key string, lapsed map[string]bool) (int, []string) {
	kv, err := c.Do(ctx, c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		return 1, []string{fmt.Sprintf("redis %s: %v", key, err)}
	}
	n, gone := 0, 0
	for inst, v := range kv {
		units, err := strconv.Atoi(v)
		if err != nil {
			return 1, []string{fmt.Sprintf("redis %s: %s holds %q", key, inst, v)}
		}
		if lapsed[inst] {
			gone += units
			continue
		}
		n += units
	}
	var notes []string
	if n != 0 {
		notes = append(notes, fmt.Sprintf("redis %s (hash) %d", key, n))
	}
	if gone != 0 {
		notes = append(notes, fmt.Sprintf("redis %s: %d units of lapsed leases, reaped at the next claim (not counted)", key, gone))
	}
	return n, notes
}

func getJSON(ctx context.Context, url string, v any) error {
	body, err := getText(ctx, url)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(body), v)
}

func getText(ctx context.Context, url string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(b), err
}

// sumMetric sums every sample of a Prometheus text metric.
func sumMetric(text, name string) float64 {
	total := 0.0
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64); err == nil {
			total += v
		}
	}
	return total
}

// countPanics counts the panic reports in a proxy's log.
// lastLogErrors returns the last n lines of a process's log at error
// level or above (Caddy's JSON logs), each cut to 600 bytes.
func lastLogErrors(logPath string, n int) []string {
	f, err := os.Open(logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"level":"error"`) && !strings.Contains(line, `"level":"fatal"`) && !strings.Contains(line, "panic") {
			continue
		}
		if len(line) > 600 {
			line = line[:600]
		}
		if out = append(out, line); len(out) > n {
			out = out[1:]
		}
	}
	return out
}

func countPanics(logPath string) int {
	f, err := os.Open(logPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "panic") {
			n++
		}
	}
	return n
}

// snapshotLogs lists the log files of the live processes.
func (m *procs) snapshotLogs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.live))
	for _, p := range m.live {
		out = append(out, p.logPath)
	}
	return out
}

// redisProc is the scenario's running redis-server, or nil.
func (r *runner) redisProc() *proc {
	r.infra.mu.Lock()
	defer r.infra.mu.Unlock()
	for i := len(r.infra.live) - 1; i >= 0; i-- {
		p := r.infra.live[i]
		select {
		case <-p.done:
		default:
			if p.name == "redis-server" {
				return p
			}
		}
	}
	return nil
}

// signalRedis freezes (SIGSTOP) or thaws (SIGCONT) Redis: its keys stay.
func (r *runner) signalRedis(sig syscall.Signal) error {
	p := r.redisProc()
	if p == nil {
		return errors.New("no redis-server running")
	}
	return p.cmd.Process.Signal(sig)
}

// restartRedis kills Redis and starts it again on the same port: empty,
// or from the snapshot snapshotRedis took (older records).
func (r *runner) restartRedis(fromSnapshot bool) error {
	p := r.redisProc()
	if p == nil {
		return errors.New("no redis-server running")
	}
	if _, err := p.stop(time.Second); err != nil {
		return err
	}
	if !fromSnapshot {
		// redis-server loads dump.rdb from its --dir when there is one.
		if err := os.Remove(filepath.Join(r.tmp, "redis", "dump.rdb")); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	np, err := r.infra.start("redis-server", nil, p.cmd.Path, p.cmd.Args[1:]...)
	if err != nil {
		return err
	}
	return waitListening(r.ctx, np, r.redis, 10*time.Second)
}

// snapshotRedis has Redis write its records to dump.rdb now (SAVE), for
// a later restartRedis(true).
func (r *runner) snapshotRedis(ctx context.Context) error {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.redis}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Do(ctx, c.B().Save().Build()).Error()
}

func skipped(msg string) error { return fmt.Errorf("%w: %s", errSkipped, msg) }
