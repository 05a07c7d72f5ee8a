package integration

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redistest"
)

// testRedis returns the address of a real Redis: SLUICE_TEST_REDIS_ADDR
// (scripts/test.sh and CI start one), else a private redis-server started
// for this test binary (stopped when TestMain ends). In CI, no Redis is a
// failure.
func testRedis(t testing.TB) string { return redistest.Addr(t) }

// Two Sluice "instances" (two sites, each its own store and identity in
// Redis, no shared process state for the counts) in front of one pool of
// one-at-a-time replicas: the global view spreads a concurrent burst
// exactly, where each instance alone would see only half of the load.
func TestTwoInstancesShareOneGlobalLeastRequestView(t *testing.T) {
	redistest.Each(t, testTwoInstancesShareOneGlobalLeastRequestView)
}

func testTwoInstancesShareOneGlobalLeastRequestView(t *testing.T, tg redistest.Target) {
	addr := strings.Join(tg.Conn.Addrs, " ")                     // a cluster: every node listed
	prefix := fmt.Sprintf("itest-%d", time.Now().UnixNano()%1e9) // both instances share it
	policy := func(instance string) string {
		return fmt.Sprintf("lb_policy global_redis_least {\n\t\t\tpool grl\n\t\t\tredis %s\n\t\t\tkey_prefix %s\n\t\t\tinstance_id %s\n\t\t}", addr, prefix, instance)
	}
	var sites strings.Builder
	for p := 9911; p <= 9914; p++ {
		fmt.Fprintf(&sites, "\n:%d {\n\tbind 127.0.0.1\n\tinference_sim {\n\t\tname grl-%d\n\t\tconcurrency 1\n\t\tlatency fixed 1s\n\t}\n}\n", p, p)
	}
	startCaddy(t, globals+fmt.Sprintf(`
:9901 {
	custom_router grl
	reverse_proxy {
		dynamic custom_router grl
		%s
	}
}
:9902 {
	reverse_proxy {
		dynamic custom_router grl
		%s
	}
}
`, policy("a"), policy("b"))+sites.String())
	setBackends(t, "http://127.0.0.1:9901", "http://127.0.0.1:9911", "http://127.0.0.1:9912", "http://127.0.0.1:9913", "http://127.0.0.1:9914")

	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := 0; i < 8; i++ {
		url := []string{"http://127.0.0.1:9901", "http://127.0.0.1:9902"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := complete(url)
			mu.Lock()
			statuses[o.status]++
			mu.Unlock()
		}()
		time.Sleep(20 * time.Millisecond) // all 8 in flight long before the first ends (1 s)
	}
	wg.Wait()
	if statuses[200] != 8 {
		t.Fatalf("statuses %v", statuses)
	}
	for p := 9911; p <= 9914; p++ {
		st := simReplica(t, fmt.Sprintf("grl-%d", p)).Stats()
		if st.Requests != 2 || st.MaxWaiting > 1 {
			t.Fatalf("replica %d got %d requests (max waiting %d): the global view must spread 8 over 4 as 2 each", p, st.Requests, st.MaxWaiting)
		}
	}
	eventually(t, "global counts back to 0", func() bool {
		m := metricsText(t, "http://127.0.0.1:9901")
		return strings.Contains(m, `sluice_redis_inflight{addr="127.0.0.1:9911",pool="grl"} 0`) &&
			!strings.Contains(m, `sluice_redis_inflight{addr="127.0.0.1:9912",pool="grl"} 1`)
	})
}

func TestSaturatedPoolIsShedWith503(t *testing.T) {
	addr := testRedis(t)
	startCaddy(t, globals+fmt.Sprintf(`
:9920 {
	custom_router grl-shed
	reverse_proxy {
		dynamic custom_router grl-shed
		lb_policy global_redis_least {
			pool grl-shed
			redis %s
			key_prefix shed-%d
			max_inflight 1
		}
	}
}
`, addr, time.Now().UnixNano()%1e9)+strings.ReplaceAll(sims(9921, 9922), "150ms", "1s"))
	url := "http://127.0.0.1:9920"
	setBackends(t, url, "http://127.0.0.1:9921", "http://127.0.0.1:9922")
	ok, shed := 0, 0
	for o := range burst(url, 5) {
		switch {
		case o.status == 200:
			ok++
		case o.status == 503 && o.errType == "pool_saturated" && o.retryAfter != "":
			shed++
		default:
			t.Fatalf("unexpected %+v", o)
		}
	}
	if ok != 2 || shed != 3 {
		t.Fatalf("ok %d shed %d: max_inflight 1 over 2 replicas serves 2 and sheds the rest at once", ok, shed)
	}
}

func TestGlobalQueueAcrossTwoInstancesNeverOverloadsAReplica(t *testing.T) {
	redistest.Each(t, testGlobalQueueAcrossTwoInstancesNeverOverloadsAReplica)
}

func testGlobalQueueAcrossTwoInstancesNeverOverloadsAReplica(t *testing.T, tg redistest.Target) {
	addr := strings.Join(tg.Conn.Addrs, " ") // a cluster: every node listed
	prefix := fmt.Sprintf("q-%d", time.Now().UnixNano()%1e9)
	policy := func(instance string) string {
		return fmt.Sprintf("lb_policy global_redis_least {\n\t\t\tpool grlq\n\t\t\tredis %s\n\t\t\tkey_prefix %s\n\t\t\tinstance_id %s\n\t\t\tmax_inflight 1\n\t\t\tqueue_timeout 20s\n\t\t}", addr, prefix, instance)
	}
	startCaddy(t, globals+fmt.Sprintf(`
:9930 {
	custom_router grlq
	reverse_proxy {
		dynamic custom_router grlq
		%s
	}
}
:9929 {
	reverse_proxy {
		dynamic custom_router grlq
		%s
	}
}
`, policy("a"), policy("b"))+strings.ReplaceAll(sims(9927, 9928), "150ms", "300ms"))
	setBackends(t, "http://127.0.0.1:9930", "http://127.0.0.1:9927", "http://127.0.0.1:9928")
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for i := 0; i < 8; i++ {
		url := []string{"http://127.0.0.1:9930", "http://127.0.0.1:9929"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			if o := complete(url); o.status == 200 {
				mu.Lock()
				ok++
				mu.Unlock()
			} else {
				t.Errorf("request: %+v", o)
			}
		}()
	}
	wg.Wait()
	if ok != 8 {
		t.Fatalf("%d of 8 served: queued requests must all be served, none shed", ok)
	}
	total := uint64(0)
	for _, p := range []int{9927, 9928} {
		st := simReplica(t, fmt.Sprintf("sim-%d", p)).Stats()
		if st.MaxRunning != 1 || st.MaxWaiting != 0 || st.Requests < 2 {
			t.Fatalf("replica %d: %d requests, max running %d, max waiting %d: the global queue must keep one in flight per replica and use both", p, st.Requests, st.MaxRunning, st.MaxWaiting)
		}
		total += uint64(st.Requests)
	}
	if total != 8 {
		t.Fatalf("replicas saw %d requests, want 8", total)
	}
}

// Caddy restarted while Redis is down must load and serve (from the
// instance's own counts), not fail to start.
func TestLoadsAndServesWithRedisDown(t *testing.T) {
	testRedis(t) // skip rules
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close() // nothing listens there
	startCaddy(t, globals+fmt.Sprintf(`
:9940 {
	reverse_proxy 127.0.0.1:9941 127.0.0.1:9942 {
		lb_policy global_redis_least {
			pool grl-down
			redis %s
			dial_timeout 300ms
		}
	}
}
`, down)+sims(9941, 9942))
	// Sequential requests see equal local counts, and the fallback breaks
	// ties at random: 20 of them all on one replica has odds of 2^-19 (6
	// had 1/32, and did happen in CI).
	seen := map[string]int{}
	for i := 0; i < 20; i++ {
		resp, err := client.Post("http://127.0.0.1:9940/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d with Redis down, want 200 from the local fallback", i, resp.StatusCode)
		}
		seen[resp.Header.Get("X-Sim-Replica")]++
	}
	if len(seen) != 2 {
		t.Fatalf("requests per replica %v: the fallback must still spread", seen)
	}
}

// A client that sends its requests one after another to a pool of one
// replica with max_inflight 1 is never shed: the lease is released when
// the replica's response has been read to its end, not when Caddy's
// handler chain returns (the client can send its next request before
// that, and used to find the only slot still held: 503 pool_saturated).
func TestSequentialClientIsNeverShedAtMaxInflightOne(t *testing.T) {
	addr := testRedis(t)
	startCaddy(t, globals+fmt.Sprintf(`
:9950 {
	custom_router grl-seq
	reverse_proxy {
		dynamic custom_router grl-seq
		lb_policy global_redis_least {
			pool grl-seq
			redis %s
			key_prefix seq-%d
			max_inflight 1
		}
	}
}
`, addr, time.Now().UnixNano()%1e9)+strings.ReplaceAll(sims(9951), "150ms", "1ms"))
	url := "http://127.0.0.1:9950"
	setBackends(t, url, "http://127.0.0.1:9951")
	shed := 0
	for i := 0; i < 300; i++ {
		o := complete(url)
		if o.err != nil {
			t.Fatalf("request %d: %v", i, o.err)
		}
		if o.status != 200 {
			shed++
			t.Logf("request %d: %+v", i, o)
		}
	}
	if shed > 0 {
		t.Fatalf("%d of 300 sequential requests were refused by a pool whose only replica was idle", shed)
	}
}
