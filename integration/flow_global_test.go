package integration

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redistest"
)

// flow_control on two sites (two instances: different connection
// settings give each its own state, controller and gate, as two Caddy
// processes would have) in front of one pool of 4 one-at-a-time replicas.
// Ports 9501-9502 and 9511-9514.
func globalFlowConfig(tag, redis string) string {
	site := func(port int, dial string) string {
		// Locally, two pools: one controller each, as two processes have.
		// Shared, the pool-wide count picks the replica too: least_conn
		// counts a pick only after it is made, so two concurrent picks can
		// land on one replica, which would queue there.
		pool, opts, policy := fmt.Sprintf("fg-%d", port), "", "least_conn"
		if redis != "" {
			pool, opts = "fg", fmt.Sprintf("\n\t\t%s\n\t\tdial_timeout %s", redis, dial)
			policy = fmt.Sprintf("global_redis_least {\n\t\t\tpool fg\n\t\t\t%s\n\t\t}", redis)
		}
		return fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	flow_control %s {
		trusted_sources 127.0.0.0/8
		max_concurrency 1%s
	}
	reverse_proxy 127.0.0.1:9511 127.0.0.1:9512 127.0.0.1:9513 127.0.0.1:9514 {
		lb_policy %s
	}
}
`, port, pool, opts, policy)
	}
	cfg := globals + site(9501, "1s") + site(9502, "2s")
	for p := 9511; p <= 9514; p++ {
		cfg += fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	inference_sim {
		name fg-%s-%d
		concurrency 1
		latency fixed 250ms
	}
}
`, p, tag, p)
	}
	return cfg
}

// floodBoth sends n requests to each site at once and returns the
// statuses, and the largest queue any replica held.
func floodBoth(t *testing.T, tag string, n int) (map[int]int, int) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := range 2 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := complete(fmt.Sprintf("http://127.0.0.1:%d", 9501+i%2))
			mu.Lock()
			statuses[o.status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	waiting := 0
	for p := 9511; p <= 9514; p++ {
		waiting = max(waiting, simReplica(t, fmt.Sprintf("fg-%s-%d", tag, p)).Stats().MaxWaiting)
	}
	return statuses, waiting
}

// Without Redis each instance admits the whole pool's capacity, so the
// replicas queue requests themselves; with redis the two instances admit
// 4 in all and global_redis_least sends each to an idle replica, so no
// replica ever has a request waiting.
func TestFlowControlCapacitySharedThroughRedis(t *testing.T) {
	redistest.Each(t, testFlowControlCapacitySharedThroughRedis)
}

func testFlowControlCapacitySharedThroughRedis(t *testing.T, tg redistest.Target) {
	addr := strings.Join(tg.Conn.Addrs, " ") // a cluster: every node listed
	prefix := fmt.Sprintf("itest-fg-%d", time.Now().UnixNano()%1e9)

	startCaddy(t, globalFlowConfig("local", ""))
	statuses, waiting := floodBoth(t, "local", 8)
	if statuses[200] != 16 {
		t.Fatalf("local flow control: statuses %v", statuses)
	}
	if waiting == 0 {
		t.Fatalf("without redis two instances admitted 8 at once over 4 one-at-a-time replicas, yet no replica queued: the test cannot tell shared from local")
	}

	reload(t, globalFlowConfig("shared", fmt.Sprintf("redis %s\n\t\tkey_prefix %s", addr, prefix)))
	statuses, waiting = floodBoth(t, "shared", 8)
	if statuses[200] != 16 {
		t.Fatalf("shared flow control: statuses %v", statuses)
	}
	if waiting != 0 {
		t.Fatalf("with redis a replica had %d requests waiting: the two instances together admitted more than the pool's 4", waiting)
	}
	if c, fb := flowGauge(t, "sluice_flow_control_global_capacity", "fg"), flowGauge(t, "sluice_flow_control_global_fallback", "fg"); c != 4 || fb != 0 {
		t.Errorf("metrics: global capacity %v (want 4), fallback %v (want 0)", c, fb)
	}
	eventually(t, "the instances give their shares back when idle", func() bool {
		return flowGauge(t, "sluice_flow_control_global_pool_held", "fg") == 0 && flowGauge(t, "sluice_flow_control_global_held", "fg") == 0
	})
}
