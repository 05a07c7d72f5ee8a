package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/caddymodule"
)

// Two sites with cache_aware on one pool through Redis, with different
// connection settings (dial_timeout) so each has its own state, tree and
// stream reader, as two Caddy instances would: a prefix learned through
// one routes to the same replica through the other.
func TestCacheAwareTreeSharedThroughRedis(t *testing.T) {
	addr := testRedis(t)
	prefix := fmt.Sprintf("itest-ca-%d", time.Now().UnixNano()%1e9)
	policy := func(dial string, extra ...string) string {
		return fmt.Sprintf("lb_policy cache_aware {\n\t\t\tpool ca-share\n\t\t\tredis %s\n\t\t\tkey_prefix %s\n\t\t\tdial_timeout %s\n\t\t\t%s\n\t\t}", addr, prefix, dial, strings.Join(extra, "\n\t\t\t"))
	}
	config := func(a, b string) string {
		return globals + fmt.Sprintf(`
:9101 {
	custom_router ca-share
	reverse_proxy {
		dynamic custom_router ca-share
		%s
	}
}
:9102 {
	reverse_proxy {
		dynamic custom_router ca-share
		%s
	}
}
`, a, b) + sims(9111, 9112, 9113, 9114)
	}
	startCaddy(t, config(policy("1s"), policy("2s")))
	setBackends(t, "http://127.0.0.1:9101", "http://127.0.0.1:9111", "http://127.0.0.1:9112", "http://127.0.0.1:9113", "http://127.0.0.1:9114")
	if n := len(caddymodule.CacheAwareShareStats("ca-share")); n != 2 {
		t.Fatalf("%d sharing states, want 2 (one per connection)", n)
	}

	system := func(i int) string {
		return fmt.Sprintf("Family %d. ", i) + strings.Repeat(fmt.Sprintf("You answer questions about topic %d carefully. ", i), 30)
	}
	want := map[int]string{}
	for i := range 4 {
		o := chat("http://127.0.0.1:9101", system(i), "first question")
		if o.status != 200 {
			t.Fatalf("via 9101: %+v", o)
		}
		want[i] = o.replica
	}
	eventually(t, "the other site applied the 4 decisions", func() bool {
		applied := uint64(0)
		for _, st := range caddymodule.CacheAwareShareStats("ca-share") {
			applied += st.Applied
		}
		return applied == 4
	})
	for i := range 4 {
		o := chat("http://127.0.0.1:9102", system(i), "second question")
		if o.status != 200 || o.replica != want[i] {
			t.Errorf("family %d via 9102 went to %s (status %d), via 9101 to %s", i, o.replica, o.status, want[i])
		}
	}
	m := metricsText(t, "http://127.0.0.1:9101")
	if !strings.Contains(m, `sluice_cache_aware_share_connected{pool="ca-share"} 1`) {
		t.Errorf("metrics lack the sharing state:\n%s", grepLines(m, "sluice_cache_aware_share"))
	}
	drained(t, "http://127.0.0.1:9101")

	// A reload that keeps the connection keeps the sharing (same instance
	// ids: tree and stream reader kept); one that changes it replaces that
	// site's, and the old one is closed.
	ids := func() map[string]bool {
		out := map[string]bool{}
		for _, st := range caddymodule.CacheAwareShareStats("ca-share") {
			out[st.Instance] = true
		}
		return out
	}
	before := ids()
	reload(t, config(policy("1s", "cache_threshold 0.6"), policy("2s")))
	if after := ids(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("sharing states %v after a reload keeping the connection, were %v", after, before)
	}
	reload(t, config(policy("1s"), policy("3s")))
	eventually(t, "the replaced sharing closed", func() bool {
		after := ids()
		kept := 0
		for id := range after {
			if before[id] {
				kept++
			}
		}
		return len(after) == 2 && kept == 1
	})
}
