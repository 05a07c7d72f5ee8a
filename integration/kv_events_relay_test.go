package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/caddymodule"
)

// Two Sluice instances (two sites, each its own cache_aware state and
// kv_events listener, as two Caddy processes would have) in front of two
// real llm-d-inference-sim engines, each engine publishing its KV events to
// one instance only, as engines do (one address each). With redis set the
// instances relay the events they receive to each other, so each routes on
// both engines' caches. Ports: Caddy 9176-9177, engines 9178-9179, ZMQ
// 5578-5579.
func TestKVEventsRelayedBetweenInstances(t *testing.T) {
	if os.Getenv("SLUICE_LLMD_SIM") == "" {
		t.Skip("SLUICE_LLMD_SIM is not set: export SLUICE_LLMD_SIM=\"$(bash scripts/llmd-sim.sh)\" to run the real-engine tests")
	}
	addr := testRedis(t)
	prefix := fmt.Sprintf("itest-kvr-%d", time.Now().UnixNano()%1e9)
	site := func(port, zmq int, dial string, router string) string {
		return fmt.Sprintf(`
:%d {
	%s
	reverse_proxy {
		dynamic custom_router kvr
		lb_policy cache_aware {
			pool kvr
			redis %s
			key_prefix %s
			dial_timeout %s
			kv_events tcp://127.0.0.1:%d
			kv_events_tokenizer llmd_sim
		}
	}
}
`, port, router, addr, prefix, dial, zmq)
	}
	startCaddy(t, globals+site(9176, 5578, "1s", "custom_router kvr")+site(9177, 5579, "2s", ""))
	one, two := "http://127.0.0.1:9176", "http://127.0.0.1:9177"
	x, y := "127.0.0.1:9178", "127.0.0.1:9179"
	startLLMDSim(t, 9178, "tcp://127.0.0.1:5578") // X publishes to instance one
	startLLMDSim(t, 9179, "tcp://127.0.0.1:5579") // Y to instance two
	setBackends(t, one, "http://"+x, "http://"+y)

	// Prompt A goes through instance one; then, behind Sluice's back, X
	// evicts it and Y gets it. Only instance two hears of Y's blocks from
	// Y itself; instance one's tree still says X.
	a := words("alpha", 80) // 5 blocks of 16 tokens; each engine holds 8
	completeCached(t, one, a)
	// blocks is what each instance's index says replica holds.
	blocks := func(replica string) []int {
		var out []int
		for _, l := range []string{"127.0.0.1:5578", "127.0.0.1:5579"} {
			s := caddymodule.KVEventsListeners("kvr", 0)[l]
			if s == nil {
				t.Fatalf("no kv_events listener on %s", l)
			}
			out = append(out, s.Replicas[replica].Blocks)
		}
		return out
	}
	holder := ""
	eventually(t, "A in both instances' indexes", func() bool {
		for _, r := range []string{x, y} {
			if fmt.Sprint(blocks(r)) == "[5 5]" {
				holder = r
				return true
			}
		}
		return false
	})
	other := x
	if holder == x {
		other = y
	}
	completeCached(t, "http://"+holder, words("cee", 80))
	completeCached(t, "http://"+holder, words("dee", 80))
	completeCached(t, "http://"+other, a)
	eventually(t, "both indexes to see A moved", func() bool {
		return fmt.Sprint(blocks(other)) == "[5 5]" && fmt.Sprint(blocks(holder)) == "[8 8]"
	})
	outlastSpeculation()
	for _, url := range []string{one, two} {
		if got := completeCached(t, url, a); got != 80 {
			t.Errorf("A through %s found %d cached tokens, want 80 (the engine that holds it)", url, got)
		}
	}
	m := metricsText(t, one)
	for _, want := range []string{`sluice_kv_events_relay_connected{pool="kvr"} 1`, `sluice_kv_events_relay_published_total{pool="kvr"}`,
		`sluice_kv_events_relay_received_total{pool="kvr"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "sluice_kv_events_relay"))
		}
	}
	drained(t, one) // the pool's health (instance two serves no custom_router)
}
