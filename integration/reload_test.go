package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// A reload is a deploy. For every Sluice module, through a real Caddy:
//
//  1. a good config serves (200);
//  2. a reload whose Sluice module has one invalid value is refused, and
//     the running config still serves and still follows set-backends;
//  3. a reload that is refused because another module fails after the
//     Sluice module was provisioned leaves the running settings as they
//     were (the refused config's new value must not leak into them);
//  4. a good reload with a changed setting applies it.

type reloadCase struct {
	module string
	pool   string
	port   int // site; the two replicas listen on port+1 and port+2
	// block is the Sluice part of the route for a setting value.
	block func(setting string) string
	// settings: the first config's value, the refused config's, the last good reload's.
	first, refused, second string
	// badFrom → badTo turns the adapted JSON of a good config into one
	// whose Sluice module fails its own validation at load.
	badFrom, badTo string
	// applied reports whether the running config uses setting.
	applied func(t *testing.T, url, setting string) bool
}

func reloadCases() []reloadCase {
	redis := ""
	return []reloadCase{
		{
			module: "queued_least_latency", pool: "rl-qll", port: 9701,
			block: func(s string) string {
				return `reverse_proxy {
			dynamic custom_router rl-qll
			lb_policy queued_least_latency {
				pool rl-qll
				parallelism ` + s + `
				latency_measure auto
				state_log_interval -1
			}
		}`
			},
			first: "2", refused: "5", second: "3",
			badFrom: `"latency_measure":"auto"`, badTo: `"latency_measure":"bogus"`,
			applied: func(t *testing.T, url, s string) bool {
				h := getHealth(t, url)
				for _, b := range h.Backends {
					if fmt.Sprint(b.Parallelism) != s {
						return false
					}
				}
				return len(h.Backends) > 0 && settingIs(t, url, "queued_least_latency", "Parallelism", s)
			},
		},
		{
			module: "cache_aware", pool: "rl-ca", port: 9711,
			block: func(s string) string {
				return `reverse_proxy {
			dynamic custom_router rl-ca
			lb_policy cache_aware {
				pool rl-ca
				cache_threshold ` + s + `
				fail_duration 7s
			}
		}`
			},
			first: "0.4", refused: "0.9", second: "0.6",
			badFrom: `"fail_duration":7000000000`, badTo: `"fail_duration":-7000000000`,
			applied: func(t *testing.T, url, s string) bool {
				return settingIs(t, url, "cache_aware", "CacheThreshold", s)
			},
		},
		{
			module: "load_aware", pool: "rl-la", port: 9721,
			block: func(s string) string {
				return `reverse_proxy {
			dynamic custom_router rl-la
			lb_policy load_aware {
				pool rl-la
				metrics_interval ` + s + `
				fail_duration 7s
			}
		}`
			},
			first: "1s", refused: "9s", second: "2s",
			badFrom: `"fail_duration":7000000000`, badTo: `"fail_duration":-7000000000`,
			applied: func(t *testing.T, url, s string) bool {
				return settingIs(t, url, "load_aware", "Interval", nanos(t, s))
			},
		},
		{
			module: "global_redis_least", pool: "rl-grl", port: 9731,
			block: func(s string) string {
				return `reverse_proxy {
			dynamic custom_router rl-grl
			lb_policy global_redis_least {
				pool rl-grl
				redis ` + redis + `
				key_prefix reload-test
				max_inflight ` + s + `
				breaker_backoff 7s
			}
		}`
			},
			first: "2", refused: "7", second: "100", // not 1: this test checks reloads, not shedding
			badFrom: `"breaker_backoff":7000000000`, badTo: `"breaker_backoff":-7000000000`,
			applied: func(t *testing.T, url, s string) bool {
				return settingIs(t, url, "global_redis_least", "MaxInflight", s)
			},
		},
		{
			// call_rate: live; the least-request mode's call budget.
			module: "global_redis_least", pool: "rl-grlc", port: 9751,
			block: func(s string) string {
				return `reverse_proxy {
			dynamic custom_router rl-grlc
			lb_policy global_redis_least {
				pool rl-grlc
				redis ` + redis + `
				key_prefix reload-test-rate
				call_rate ` + s + `
				breaker_backoff 7s
			}
		}`
			},
			first: "50", refused: "70", second: "200",
			badFrom: `"breaker_backoff":7000000000`, badTo: `"breaker_backoff":-7000000000`,
			applied: func(t *testing.T, url, s string) bool {
				return settingIs(t, url, "global_redis_least", "CallRate", s)
			},
		},
		{
			// A shared tree's Redis read_timeout (a connection setting).
			module: "cache_aware", pool: "rl-cas", port: 9761,
			block: func(s string) string {
				return `reverse_proxy {
			dynamic custom_router rl-cas
			lb_policy cache_aware {
				pool rl-cas
				redis ` + redis + `
				key_prefix reload-test-share
				read_timeout ` + s + `
				fail_duration 7s
			}
		}`
			},
			first: "1s", refused: "9s", second: "2s",
			badFrom: `"fail_duration":7000000000`, badTo: `"fail_duration":-7000000000`,
			applied: func(t *testing.T, url, s string) bool {
				return settingIs(t, url, "cache_aware", "ReadTimeout", nanos(t, s))
			},
		},
		{
			module: "flow_control", pool: "rl-fc", port: 9741,
			block: func(s string) string {
				return `flow_control rl-fc {
			metrics_interval ` + s + `
			max_concurrency 4
			max_body_bytes 4096
		}
		reverse_proxy {
			dynamic custom_router rl-fc
		}`
			},
			first: "1s", refused: "9s", second: "2s",
			badFrom: `"max_body_bytes":4096`, badTo: `"max_body_bytes":-4096`,
			applied: func(t *testing.T, url, s string) bool {
				return settingIs(t, url, "flow_control", "MetricsInterval", nanos(t, s))
			},
		},
	}
}

// failingModule is a standard Caddy handler that adapts but fails to
// provision (its client certificate files do not exist): placed after the
// Sluice module in the route, it makes Caddy refuse the config after
// Sluice's module was provisioned.
const failingModule = `reverse_proxy 127.0.0.1:1 {
			transport http {
				tls_client_auth /nonexistent/sluice-client.pem /nonexistent/sluice-client.key
			}
		}`

func reloadConfig(c reloadCase, setting string, failAfter bool) string {
	tail := ""
	if failAfter {
		tail = failingModule
	}
	return globals + fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	route {
		custom_router %s
		%s
		%s
	}
}
`, c.port, c.pool, c.block(setting), tail) + sims(c.port+1, c.port+2)
}

func TestReloadLifecycleEveryModule(t *testing.T) {
	for _, c := range reloadCases() {
		t.Run(c.module+"/"+c.pool, func(t *testing.T) {
			if strings.Contains(c.block("x"), "redis \n") {
				addr := testRedis(t)
				block := c.block
				c.block = func(s string) string { return strings.Replace(block(s), "redis \n", "redis "+addr+"\n", 1) }
			}
			url := fmt.Sprintf("http://127.0.0.1:%d", c.port)
			one := fmt.Sprintf("http://127.0.0.1:%d", c.port+1)
			two := fmt.Sprintf("http://127.0.0.1:%d", c.port+2)
			startCaddy(t, reloadConfig(c, c.first, false))
			setBackends(t, url, one, two)
			expectServed(t, url, "", "first config")
			if !c.applied(t, url, c.first) {
				t.Fatalf("the first config's %s %s is not in force", c.module, c.first)
			}

			// 2. The Sluice module's own validation fails.
			good := reloadConfig(c, c.refused, false)
			loadRefused(t, good, c.badFrom, c.badTo)
			expectServed(t, url, "", "after a reload refused by the Sluice module")
			setBackends(t, url, two)
			expectServed(t, url, fmt.Sprintf("sim-%d", c.port+2), "set-backends after the refused reload")
			if !c.applied(t, url, c.first) {
				t.Fatalf("a refused reload changed the running %s settings", c.module)
			}

			// 3. Another module fails after Sluice's was provisioned.
			loadRefused(t, reloadConfig(c, c.refused, true), "", "")
			expectServed(t, url, "", "after a reload refused by another module")
			setBackends(t, url, one)
			expectServed(t, url, fmt.Sprintf("sim-%d", c.port+1), "set-backends after the second refused reload")
			if !c.applied(t, url, c.first) {
				t.Fatalf("a reload refused after %s was provisioned leaked its setting %s into the running config", c.module, c.refused)
			}

			// 3b. Every module provisions, then Caddy aborts the start (a
			// listener cannot bind): the running settings stay.
			busy, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			loadRefused(t, reloadConfig(c, c.refused, false)+fmt.Sprintf(`
%s {
	bind 127.0.0.1
	respond "never"
}
`, busy.Addr().String()[len("127.0.0.1"):]), "", "")
			busy.Close()
			expectServed(t, url, fmt.Sprintf("sim-%d", c.port+1), "after a reload whose start was aborted")
			if !c.applied(t, url, c.first) {
				t.Fatalf("a reload whose start was aborted left its %s setting %s in force", c.module, c.refused)
			}

			// 4. A good reload with a changed setting applies it.
			reload(t, reloadConfig(c, c.second, false))
			expectServed(t, url, fmt.Sprintf("sim-%d", c.port+1), "after a good reload")
			if !c.applied(t, url, c.second) {
				t.Fatalf("a good reload did not apply %s %s", c.module, c.second)
			}
			setBackends(t, url, two)
			expectServed(t, url, fmt.Sprintf("sim-%d", c.port+2), "set-backends after the good reload")
			drained(t, url)
		})
	}
}

// expectServed sends a few requests; each must be a 200, from replica
// when it is not empty.
func expectServed(t *testing.T, url, replica, when string) {
	t.Helper()
	for i := 0; i < 3; i++ {
		// Not retried: load waits until the servers of the replaced (or
		// refused) config have closed their listeners, so neither this
		// request nor the proxy's to a replica site meets one.
		o := complete(url)
		if o.err != nil || o.status != 200 {
			t.Fatalf("%s: request %d: %+v", when, i, o)
		}
		if replica != "" && o.replica != replica {
			t.Fatalf("%s: served by %q, want %q (the backend set is not followed)", when, o.replica, replica)
		}
	}
}

// loadRefused posts caddyfile (with from → to applied to its JSON) to
// /load and expects Caddy to refuse it.
func loadRefused(t *testing.T, caddyfile, from, to string) {
	t.Helper()
	cfg := adapt(t, caddyfile)
	if from != "" {
		if !bytes.Contains(cfg, []byte(from)) {
			t.Fatalf("the adapted config has no %s:\n%s", from, cfg)
		}
		cfg = bytes.Replace(cfg, []byte(from), []byte(to), 1)
	}
	status, body := load(t, cfg)
	if status == 200 {
		t.Fatalf("Caddy accepted a config it must refuse (%s → %s)", from, to)
	}
	t.Logf("refused as expected: %d %s", status, body)
}

// settingIs reports whether the pool's health report shows, under the
// module's live settings, a field named key with value want (searched at
// any depth: the settings are the policy state's own config).
func settingIs(t *testing.T, url, module, key, want string) bool {
	t.Helper()
	resp, err := client.Get(url + "/_custom_router/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		Settings map[string]any `json:"settings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	s, ok := h.Settings[module]
	if !ok {
		t.Logf("health shows no settings for %s: %v", module, h.Settings)
		return false
	}
	found := findKey(s, key)
	for _, v := range found {
		if fmt.Sprint(v) == want {
			return true
		}
	}
	t.Logf("%s %s = %v, want %s", module, key, found, want)
	return false
}

func findKey(v any, key string) []any {
	var out []any
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if k == key {
				out = append(out, e)
			}
			out = append(out, findKey(e, key)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, findKey(e, key)...)
		}
	}
	return out
}

// nanos renders a duration setting as the health report's JSON shows it
// (time.Duration marshals as integer nanoseconds).
func nanos(t *testing.T, s string) string {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(float64(d))
}

// custom_router's `backends` seeds a pool with no set; a config Caddy
// refuses must not seed the pool a running config routes with (it used to
// be seeded during provisioning, and the running config then followed the
// refused config's set).
func TestRefusedConfigDoesNotSeedARunningPool(t *testing.T) {
	site, static, other := 9891, 9892, 9893
	running := globals + fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:%d {
		lb_policy queued_least_latency {
			pool seeded
			state_log_interval -1
		}
	}
}
`, site, static) + sims(static, other)
	startCaddy(t, running)
	url := fmt.Sprintf("http://127.0.0.1:%d", site)
	expectServed(t, url, fmt.Sprintf("sim-%d", static), "the running config")
	loadRefused(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	route {
		custom_router seeded {
			backends http://127.0.0.1:%d
		}
		reverse_proxy 127.0.0.1:%d {
			lb_policy queued_least_latency {
				pool seeded
				state_log_interval -1
			}
		}
		%s
	}
}
`, site, other, static, failingModule)+sims(static, other), "", "")
	expectServed(t, url, fmt.Sprintf("sim-%d", static), "after a refused config that seeds the pool")
}
