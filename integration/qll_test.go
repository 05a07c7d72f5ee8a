package integration

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// qllConfig: Sluice on :port in front of pool `pool`, with a latency
// threshold low enough that each 150 ms replica takes one request at a
// time, so requests visibly queue at the edge.
func qllConfig(port int, pool, extra string, simPorts ...int) string {
	return globals + fmt.Sprintf(`
:%d {
	custom_router %s
	reverse_proxy {
		dynamic custom_router %s
		lb_policy queued_least_latency {
			pool %s
			latency_threshold 10ms
			%s
		}
	}
}
`, port, pool, pool, pool, extra) + sims(simPorts...)
}

func TestQueuedRequestsDrainToReplicaAddedMidBurst(t *testing.T) {
	startCaddy(t, qllConfig(9210, "drain", "", 9211, 9212, 9213))
	url := "http://127.0.0.1:9210"
	setBackends(t, url, "http://127.0.0.1:9211")

	const n = 12
	results := burst(url, n)
	eventually(t, "requests to queue at the edge", func() bool { return getHealth(t, url).QueueDepth >= 6 })
	setBackends(t, url, "http://127.0.0.1:9211", "http://127.0.0.1:9212", "http://127.0.0.1:9213")

	served := map[string]int{}
	for o := range results {
		if o.err != nil || o.status != 200 {
			t.Fatalf("request failed: %+v", o)
		}
		served[o.replica]++
	}
	if served["sim-9212"] == 0 || served["sim-9213"] == 0 {
		t.Fatalf("queued requests did not drain to the new replicas: %v", served)
	}
	if served["sim-9211"]+served["sim-9212"]+served["sim-9213"] != n {
		t.Fatalf("served %v, want %d in all", served, n)
	}
	drained(t, url)
}

func TestQueueOverflowAnswers503WithRetryAfterAndLeavesNothingHanging(t *testing.T) {
	startCaddy(t, qllConfig(9220, "overflow", "queue_max_size 3", 9221))
	url := "http://127.0.0.1:9220"
	setBackends(t, url, "http://127.0.0.1:9221")

	const n = 16
	ok, evicted := 0, 0
	for o := range burst(url, n) {
		switch {
		case o.err != nil:
			t.Fatalf("request hung or failed: %v", o.err)
		case o.status == 200:
			ok++
		case o.status == 503 && o.errType == "queue_evicted":
			evicted++
			if o.retryAfter == "" {
				t.Errorf("503 without Retry-After")
			}
		default:
			t.Fatalf("unexpected answer %+v", o)
		}
	}
	if ok+evicted != n || evicted == 0 || ok < 4 {
		t.Fatalf("ok %d evicted %d of %d: the queue of 3 must overflow", ok, evicted, n)
	}
	drained(t, url)
	m := metricsText(t, url)
	for _, want := range []string{
		`custom_router_requests_evicted_total{pool="overflow"} ` + fmt.Sprint(evicted),
		`custom_router_requests_dispatched_total{pool="overflow"} ` + fmt.Sprint(ok),
		`custom_router_queue_depth{pool="overflow"} 0`,
		`custom_router_backend_inflight_requests{addr="127.0.0.1:9221",pool="overflow"} 0`,
		`sluice_backend_slots{addr="127.0.0.1:9221",pool="overflow"} 1`, // a threshold: one slot
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestNoBackendsFailsFast(t *testing.T) {
	startCaddy(t, qllConfig(9230, "empty", ""))
	url := "http://127.0.0.1:9230"
	setBackends(t, url)
	o := complete(url)
	if o.status != 503 || o.errType != "no_backends" || o.retryAfter == "" {
		t.Fatalf("got %+v, want 503 no_backends with Retry-After", o)
	}
}

func TestDeadReplicaIsMarkedDownAndNeverLearnsFakeLatency(t *testing.T) {
	startCaddy(t, qllConfig(9240, "dead", "fail_duration 1m", 9241))
	url := "http://127.0.0.1:9240"
	// 9249 has no listener: connections are refused at once.
	setBackends(t, url, "http://127.0.0.1:9249", "http://127.0.0.1:9241")
	failed := 0
	for i := 0; i < 10; i++ {
		o := complete(url)
		if o.err != nil {
			t.Fatal(o.err)
		}
		if o.status != 200 {
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("%d requests failed; the dead replica should cost exactly one before it is marked down", failed)
	}
	h := getHealth(t, url)
	dead := h.Backends[0]
	if dead.Addr != "127.0.0.1:9249" || !dead.Down || dead.Tried || dead.EWMALatency != 0 || dead.Failures != 1 {
		t.Fatalf("dead replica: %+v (want down, failures 1, no EWMA)", dead)
	}
	drained(t, url)
}

func TestClientsThatGiveUpLeaveTheQueue(t *testing.T) {
	startCaddy(t, qllConfig(9250, "gaveup", "", 9251))
	url := "http://127.0.0.1:9250"
	setBackends(t, url, "http://127.0.0.1:9251")
	impatient := &http.Client{Timeout: 50 * time.Millisecond}
	done := make(chan struct{})
	for i := 0; i < 6; i++ {
		go func() {
			defer func() { done <- struct{}{} }()
			resp, err := impatient.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	for i := 0; i < 6; i++ {
		<-done
	}
	drained(t, url)
	h := getHealth(t, url)
	for _, b := range h.Backends {
		if b.Failures != 0 {
			t.Fatalf("client cancellations counted against the replica: %+v", b)
		}
	}
	if o := complete(url); o.status != 200 {
		t.Fatalf("after cancellations: %+v", o)
	}
}

func TestHotReloadKeepsBackendsStateAndQueuedRequests(t *testing.T) {
	cfg := qllConfig(9260, "reload", "", 9261)
	startCaddy(t, cfg)
	url := "http://127.0.0.1:9260"
	setBackends(t, url, "http://127.0.0.1:9261")
	if o := complete(url); o.status != 200 {
		t.Fatalf("warm-up: %+v", o)
	}
	before := getHealth(t, url).Backends[0]

	results := burst(url, 6)
	eventually(t, "requests to queue", func() bool { return getHealth(t, url).QueueDepth >= 3 })
	// The same site with a changed option: Caddy provisions the new config
	// while the old one still serves the queued requests.
	reload(t, strings.Replace(cfg, "latency_threshold 10ms", "latency_threshold 20ms", 1))

	for o := range results {
		if o.err != nil || o.status != 200 {
			t.Fatalf("a request queued across the reload failed: %+v", o)
		}
	}
	after := getHealth(t, url)
	if len(after.Backends) != 1 || after.Backends[0].Addr != before.Addr {
		t.Fatalf("backend set lost on reload: %+v", after.Backends)
	}
	if !after.Backends[0].Tried || after.Backends[0].Dispatched < before.Dispatched+6 {
		t.Fatalf("policy state lost on reload: before %+v after %+v", before, after.Backends[0])
	}
	drained(t, url)
}

func TestSetBackendsRejectsBadInputAndKeepsTheSet(t *testing.T) {
	startCaddy(t, qllConfig(9270, "badinput", "", 9271))
	url := "http://127.0.0.1:9270"
	setBackends(t, url, "http://127.0.0.1:9271")
	for _, c := range []struct {
		body   string
		status int
	}{
		{`{"backends": ["http://127.0.0.1:9271", "10.0.0.1"]}`, 400},
		{`{"backends": "http://127.0.0.1:9271"}`, 400},
		{`not json`, 400},
		{`{}`, 400},
		{`{"backends": []} trailing`, 400},
		{`{"backends": ["` + strings.Repeat("x", 2<<20) + `"]}`, 413},
		// Never replicas: cloud metadata / link-local, multicast, unspecified.
		{`{"backends": ["http://169.254.169.254:80"]}`, 400},
		{`{"backends": ["http://[fe80::1]:8000"]}`, 400},
		{`{"backends": ["http://224.0.0.1:8000"]}`, 400},
		{`{"backends": ["http://0.0.0.0:9271"]}`, 400},
		// Never Caddy itself: its admin endpoint, or this listener (a loop).
		{`{"backends": ["http://127.0.0.1:2999"]}`, 400},
		{`{"backends": ["http://localhost:2999"]}`, 400},
		{`{"backends": ["http://127.0.0.1:9270"]}`, 400},
	} {
		resp, err := client.Post(url+"/_custom_router/set-backends", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !bytes.Contains(msg, []byte(`"error"`)) {
			t.Errorf("body %.40q: got %d %s, want %d with a JSON error", c.body, resp.StatusCode, msg, c.status)
		}
	}
	h := getHealth(t, url)
	if len(h.Backends) != 1 || h.Backends[0].Addr != "127.0.0.1:9271" {
		t.Fatalf("bad input changed the set: %+v", h.Backends)
	}
	if o := complete(url); o.status != 200 {
		t.Fatalf("after bad input: %+v", o)
	}
}

func TestTokenProtectsSetBackendsAndAdminAPIWorks(t *testing.T) {
	startCaddy(t, globals+`
:9280 {
	custom_router {
		pool tokened
		token s3cret
	}
	reverse_proxy {
		dynamic custom_router tokened
		lb_policy queued_least_latency {
			pool tokened
		}
	}
}
`+sims(9281))
	url := "http://127.0.0.1:9280"
	body := `{"backends": ["http://127.0.0.1:9281"]}`
	resp, err := client.Post(url+"/_custom_router/set-backends", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("set-backends without token: %d, want 401", resp.StatusCode)
	}
	// The admin API is private by design and needs no token.
	resp, err = client.Post(adminURL+"/sluice/pools/tokened/set-backends", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("admin set-backends: %d %s", resp.StatusCode, msg)
	}
	if o := complete(url); o.status != 200 || o.replica != "sim-9281" {
		t.Fatalf("after admin set-backends: %+v", o)
	}
	resp, err = client.Get(adminURL + "/sluice/pools/tokened/health")
	if err != nil {
		t.Fatal(err)
	}
	msg, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(msg, []byte(`"addr":"127.0.0.1:9281"`)) {
		t.Fatalf("admin health: %d %s", resp.StatusCode, msg)
	}
}

func metricsText(t *testing.T, url string) string {
	t.Helper()
	resp, err := client.Get(url + "/_custom_router/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestRetriedAttemptIsReleasedAsFailureAndTheRetrySucceeds(t *testing.T) {
	startCaddy(t, globals+`
:9290 {
	custom_router retry
	reverse_proxy {
		dynamic custom_router retry
		lb_retries 2
		lb_policy queued_least_latency {
			pool retry
			fail_duration 1m
		}
	}
}
`+sims(9291))
	url := "http://127.0.0.1:9290"
	setBackends(t, url, "http://127.0.0.1:9299", "http://127.0.0.1:9291")
	for i := 0; i < 6; i++ {
		if o := complete(url); o.status != 200 || o.replica != "sim-9291" {
			t.Fatalf("request %d: %+v (a refused dial must be retried on the live replica)", i, o)
		}
	}
	h := getHealth(t, url)
	dead, live := h.Backends[0], h.Backends[1]
	if dead.Failures != 1 || !dead.Down || dead.Tried {
		t.Fatalf("dead replica %+v: want exactly one failure, down, no EWMA", dead)
	}
	if live.Dispatched != 6 || live.Failures != 0 {
		t.Fatalf("live replica %+v: want 6 dispatched", live)
	}
	drained(t, url)
}

// With no setting at all, a one-at-a-time replica gets one request at a
// time (its learned slots) and the rest of a burst waits at the edge, where
// any replica that frees can take it. The old default (a 3 s threshold)
// piled the burst into the replica's own queue: 150 ms × 12 is under 3 s.
func TestDefaultsQueueABurstAtTheEdgeForAOneAtATimeReplica(t *testing.T) {
	startCaddy(t, globals+`
:9957 {
	custom_router qll-defaults
	reverse_proxy {
		dynamic custom_router qll-defaults
		lb_policy queued_least_latency {
			pool qll-defaults
		}
	}
}
`+sims(9958))
	url := "http://127.0.0.1:9957"
	setBackends(t, url, "http://127.0.0.1:9958")
	// Teach it first: one request alone, one more (the slow start's probe).
	for i := 0; i < 3; i++ {
		if o := complete(url); o.status != 200 {
			t.Fatalf("warm-up: %+v", o)
		}
	}
	const n = 12
	results := burst(url, n)
	maxInFlight := 0
	eventually(t, "most of the burst to wait at the edge", func() bool {
		h := getHealth(t, url)
		maxInFlight = max(maxInFlight, inFlight(h))
		return h.QueueDepth >= n-3
	})
	for o := range results {
		if o.err != nil || o.status != 200 {
			t.Fatalf("request failed: %+v", o)
		}
	}
	if maxInFlight > 2 {
		t.Fatalf("%d in flight on a one-at-a-time replica", maxInFlight)
	}
	drained(t, url)
}
