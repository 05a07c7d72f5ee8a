package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// An option that holds one value, written twice in one block, is refused
// naming the directive and the option: the Caddyfile would otherwise load
// with whichever line came last, silently (e.g. `custom_router a { pool b
// }` serving pool b). The pool argument on the directive line counts as
// the pool option. List options and the options that add an entry to a
// map or a list (backends, redis, scorer, objective, band) stay repeatable.
func TestCaddyfileRepeatedOptionIsRefused(t *testing.T) {
	refused := []goldenErrCase{
		{"custom_router/pool argument and option", goldenSite("custom_router a {\n\tpool b\n}\nreverse_proxy {\n\tdynamic custom_router a\n}"),
			[]string{"custom_router", "pool"}},
		{"flow_control/pool argument and option", goldenSite("flow_control a {\n\tpool b\n}\nreverse_proxy 127.0.0.1:9001"),
			[]string{"flow_control", "pool"}},
		{"custom_router/token twice", goldenCustomRouter("token a\ntoken b"), []string{"custom_router", "token"}},
		{"cache_aware/cache_threshold twice", goldenCacheAware("cache_threshold 0.3\n\t\tcache_threshold 0.9"), []string{"cache_aware", "cache_threshold"}},
		{"cache_aware/cache_threshold 0 then 0.9", goldenCacheAware("cache_threshold 0\n\t\tcache_threshold 0.9"), []string{"cache_aware", "cache_threshold"}},
		{"qll/pool twice", goldenQLL("pool a\n\t\tpool b"), []string{"queued_least_latency", "pool"}},
		{"qll/latency_threshold auto then 3", goldenQLL("latency_threshold auto\n\t\tlatency_threshold 3"), []string{"queued_least_latency", "latency_threshold"}},
		{"flow_control/max_requests twice", goldenFlow("max_requests 5\n\tmax_requests 7"), []string{"flow_control", "max_requests"}},
		{"global_redis_least/call_rate twice", goldenRedis("call_rate unlimited\n\t\tcall_rate 10"), []string{"global_redis_least", "call_rate"}},
		{"load_aware/threshold twice", goldenLoadAware("threshold 2\n\t\tthreshold 3"), []string{"load_aware", "threshold"}},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			goldenTempDirs(t)
			out, _, err := goldenAdapt(t, "Caddyfile", caddyfile.Format([]byte(tc.src)))
			if err == nil {
				t.Fatalf("accepted, want an error naming %q\nCaddyfile:\n%s\nJSON:\n%s", tc.want, tc.src, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q: %v", w, err)
				}
			}
		})
	}

	repeatable := map[string]string{
		"custom_router/backends":  goldenCustomRouter("backends http://10.0.0.1:8000\nbackends http://10.0.0.2:8000"),
		"custom_router/argument":  goldenSite("custom_router a {\n\ttoken x\n}\nreverse_proxy {\n\tdynamic custom_router a\n}"),
		"cache_aware/redis":       goldenCacheAware("redis 127.0.0.1:6379\n\t\tredis 127.0.0.1:6380"),
		"load_aware/scorer":       goldenLoadAware("scorer queue 1\n\t\tscorer kv_cache 2"),
		"flow_control/objective":  goldenFlow("objective premium 10\n\tobjective batch -10"),
		"flow_control/band":       goldenFlow("band 5 {\n\tmax_bytes 1024\n}\nband 10 {\n\tmax_bytes 2048\n}"),
		"qll/one of each, no dup": goldenQLL("pool a\n\t\tlatency_threshold auto\n\t\tparallelism 2"),
	}
	for name, src := range repeatable {
		t.Run(name, func(t *testing.T) {
			goldenTempDirs(t)
			if _, _, err := goldenAdapt(t, "Caddyfile", caddyfile.Format([]byte(src))); err != nil {
				t.Fatalf("refused: %v\nCaddyfile:\n%s", err, src)
			}
		})
	}
}
