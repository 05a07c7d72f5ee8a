package integration

import (
	"fmt"
	"testing"
	"time"
)

// Every Sluice policy honours Caddy's own view of an upstream
// (Upstream.Available: active health checks, passive health,
// max_requests) on top of its own passive health. Here Sluice's own
// health is made blind (max_fails far above what the test sends), so only
// Caddy's active health check can keep requests off the dead upstream.
func TestEveryPolicyHonoursCaddysActiveHealthChecks(t *testing.T) {
	policies := map[string]string{
		"queued_least_latency": "max_fails 1000\n\t\t\tstate_log_interval -1",
		"cache_aware":          "max_fails 1000",
		"load_aware":           "max_fails 1000",
		"global_redis_least":   "redis REDIS\n\t\t\tkey_prefix upstream-health",
	}
	port := 9801
	for _, name := range []string{"queued_least_latency", "cache_aware", "load_aware", "global_redis_least"} {
		opts := policies[name]
		site, live, dead := port, port+1, port+2 // nothing listens on dead
		port += 10
		t.Run(name, func(t *testing.T) {
			if name == "global_redis_least" {
				opts = fmt.Sprintf("redis %s\n\t\t\tkey_prefix upstream-health", testRedis(t))
			}
			startCaddy(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:%d 127.0.0.1:%d {
		lb_policy %s {
			pool uh-%d
			%s
		}
		health_uri /health
		health_interval 50ms
		health_timeout 200ms
	}
}
`, site, live, dead, name, site, opts)+sims(live))
			url := fmt.Sprintf("http://127.0.0.1:%d", site)
			// Caddy runs its first active check as the config starts; give
			// it a moment to mark the dead upstream (not a timing assertion:
			// a slower check only makes the test fail, never pass wrongly).
			time.Sleep(300 * time.Millisecond)
			for i := 0; i < 12; i++ {
				if o := complete(url); o.err != nil || o.status != 200 || o.replica != fmt.Sprintf("sim-%d", live) {
					t.Fatalf("request %d went past Caddy's health check: %+v", i, o)
				}
			}
		})
	}
}
