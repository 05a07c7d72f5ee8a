package integration

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
	"github.com/sluice-router/sluice/sim"
)

// A reload that changes a Redis connection setting (here dial_timeout, as
// a password rotation would) gives the pool a new store; the replaced one
// keeps the requests it holds until they end. So a request queued in it
// is served (it used to get 500 shutdown), its in-flight request keeps its
// count in Redis (it used to be reaped at once, so max_inflight 1 let a
// second request onto the one-at-a-time replica), and once they have
// ended the replaced store is closed (its instance leaves Redis).
func TestConnectionReloadUnderLoadDrainsTheReplacedStore(t *testing.T) {
	addr := testRedis(t)
	prefix := fmt.Sprintf("itest-reload-%d", time.Now().UnixNano()%1e9)
	config := func(dialTimeout string) string {
		return globals + fmt.Sprintf(`
:9190 {
	custom_router reload-conn
	reverse_proxy 127.0.0.1:9191 {
		lb_policy global_redis_least {
			pool reload-conn
			redis %s
			key_prefix %s
			dial_timeout %s
			# A select Redis does not answer within read_timeout is picked
			# from local counts (0 in the new store), bypassing the queue:
			# the default 250ms is within reach of a loaded CI machine.
			read_timeout 5s
			max_inflight 1
			queue_timeout 60s
		}
	}
}
:9191 {
	bind 127.0.0.1
	inference_sim {
		name reload-conn-sim
		concurrency 1
		latency fixed 3s
	}
}
`, addr, prefix, dialTimeout)
	}
	startCaddy(t, config("5s"))
	url := "http://127.0.0.1:9190"
	rc := redistest.Client(t, redisconn.Config{Addrs: []string{addr}})
	tag := redisconn.KeyTag(prefix, "reload-conn")
	llen := func() int64 {
		n, _ := rc.Do(context.Background(), rc.B().Llen().Key(tag+":queue").Build()).AsInt64()
		return n
	}
	requestsAcrossAConnectionReload(t, url, simReplica(t, "reload-conn-sim"),
		func(n int) bool { return llen() == int64(n) },
		// Sent while the first still runs (3 s): max_inflight 1 holds the
		// third at the edge, behind the queued one, as long as the first
		// keeps its count in Redis. (Counted in Redis, not at the
		// simulated replica: the reload gave it a new instance too.)
		func() { reload(t, config("6s")) }, 2)
	eventually(t, "the replaced store to close once its requests ended", func() bool {
		keys, _ := rc.Do(context.Background(), rc.B().Keys().Pattern(tag+":alive:*").Build()).AsStrSlice()
		return len(keys) == 1
	})
	eventually(t, "nothing in flight or queued in Redis", func() bool {
		n, _ := rc.Do(context.Background(), rc.B().Zscore().Key(tag+":load").Member("127.0.0.1:9191").Build()).AsFloat64()
		return n == 0 && llen() == 0
	})
}

// The same for flow_control sharing its capacity through Redis: the
// replaced state keeps its queued request and dispatches it (it used to
// get 500 shutdown, its share given back while its request still ran, so
// the new state admitted a second request onto the one-slot pool).
func TestFlowConnectionReloadUnderLoadDrainsTheReplacedState(t *testing.T) {
	addr := testRedis(t)
	prefix := fmt.Sprintf("itest-flow-reload-%d", time.Now().UnixNano()%1e9)
	config := func(dialTimeout string) string {
		return globals + fmt.Sprintf(`
:9194 {
	flow_control fdrain {
		redis %s
		key_prefix %s
		dial_timeout %s
		max_concurrency 1
	}
	reverse_proxy 127.0.0.1:9195
}
:9195 {
	bind 127.0.0.1
	inference_sim {
		name flow-reload-sim
		concurrency 1
		latency fixed 3s
	}
}
`, addr, prefix, dialTimeout)
	}
	startCaddy(t, config("5s"))
	url := "http://127.0.0.1:9194"
	queuedNow := func() float64 { return flowGauge(t, "inference_extension_flow_control_queue_size", "fdrain") }
	// The new state shows only its own queue: the third request waits
	// there while the replaced state's requests hold the pool's one slot.
	requestsAcrossAConnectionReload(t, url, simReplica(t, "flow-reload-sim"),
		func(n int) bool { return queuedNow() == float64(n) },
		func() { reload(t, config("6s")) }, 1)
	eventually(t, "the pool's share in Redis to be given back", func() bool {
		return flowGauge(t, "sluice_flow_control_global_pool_held", "fdrain") == 0
	})
}

// requestsAcrossAConnectionReload runs the sequence both tests share on a
// one-slot replica: a first request runs, a second queues (queued(1)),
// the reload builds a new state, and a third request queues
// (queued(thirdQueued)) while the replaced state still holds the slot.
// Every request must succeed.
func requestsAcrossAConnectionReload(t *testing.T, url string, replica *sim.Replica, queued func(n int) bool, doReload func(), thirdQueued int) {
	t.Helper()
	async := func() <-chan outcome {
		out := make(chan outcome, 1)
		go func() { out <- complete(url) }()
		return out
	}
	first := async()
	eventually(t, "the first request to reach the replica", func() bool { return replica.Stats().Running == 1 })
	second := async()
	eventually(t, "the second request to queue", func() bool { return queued(1) })
	doReload()
	third := async()
	if !within(20*time.Second, func() bool { return queued(thirdQueued) }) {
		// Say what the third request did instead (a CI flake once).
		select {
		case o := <-third:
			t.Fatalf("the third request did not queue while the replaced state held the slot; it ended: %+v; replica now: %+v; health now: %s", o, replica.Stats(), rawHealth(url))
		case <-time.After(15 * time.Second):
			t.Fatalf("the third request neither queued nor ended; replica now: %+v; health now: %s", replica.Stats(), rawHealth(url))
		}
	}
	for i, ch := range []<-chan outcome{first, second, third} {
		if o := <-ch; o.err != nil || o.status != 200 {
			t.Errorf("request %d across the reload: %+v", i+1, o)
		}
	}
}

// within reports whether cond held before d passed (checked every 10 ms).
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// rawHealth is the custom router's health answer as it is, for a failure
// message.
func rawHealth(url string) string {
	resp, err := client.Get(url + "/_custom_router/health")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
	return string(b)
}
