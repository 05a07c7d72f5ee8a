package integration

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// flow_control as a new user writes it: static upstreams in reverse_proxy
// (Caddy's own policy), trusted_sources, max_concurrency 1, no band. These
// tests use ports 9990-9999 and 9800-9849.

func obviousFlowConfig(pool, latency string, upstreams ...int) string {
	var ups []string
	for _, p := range upstreams {
		ups = append(ups, fmt.Sprintf("127.0.0.1:%d", p))
	}
	cfg := globals + fmt.Sprintf(`
:9990 {
	bind 127.0.0.1
	flow_control %s {
		trusted_sources 127.0.0.0/8
		max_concurrency 1
	}
	reverse_proxy %s
}
`, pool, strings.Join(ups, " "))
	for _, p := range upstreams {
		cfg += fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	inference_sim {
		name fd-%d
		concurrency 1
		latency fixed %s
	}
}
`, p, p, latency)
	}
	return cfg
}

// flowGauge sums a flow-control gauge of pool over its label sets, from
// the admin API's Sluice metrics.
func flowGauge(t *testing.T, name, pool string) float64 {
	t.Helper()
	resp, err := client.Get(adminURL + "/sluice/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, `inference_pool="`+pool+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

func tenantPost(tenant string) outcome {
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:9990/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":2}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Gateway-Inference-Fairness-Id", tenant)
	resp, err := client.Do(req)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	o := outcome{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	if i := strings.Index(string(body), `"type":"`); i >= 0 && resp.StatusCode != 200 {
		rest := string(body)[i+len(`"type":"`):]
		o.errType = rest[:strings.Index(rest, `"`)]
	}
	return o
}

// admitted sends n requests at once and waits until flow control holds
// all of them, in flight or queued; it returns the in-flight count then.
func admitted(t *testing.T, pool string, n int) (inflight float64, done <-chan outcome) {
	t.Helper()
	out := make(chan outcome, n)
	for i := 0; i < n; i++ {
		go func() { out <- tenantPost("t") }()
	}
	eventually(t, "every request in flight or queued", func() bool {
		// A request answered before all are held can only have failed
		// (the replicas take 1.5 s): say how, rather than wait out the
		// deadline for a count that cannot come.
		select {
		case o := <-out:
			t.Fatalf("a request ended before all %d were admitted: %d %s %v", n, o.status, o.errType, o.err)
		default:
		}
		inflight = flowGauge(t, "sluice_flow_control_inflight_requests", pool)
		return inflight+flowGauge(t, "inference_extension_flow_control_queue_size", pool) == float64(n)
	})
	return inflight, out
}

func waitAll(t *testing.T, out <-chan outcome, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if o := <-out; o.err != nil || o.status != 200 {
			t.Errorf("request: %d %s %v", o.status, o.errType, o.err)
		}
	}
}

// With no backend set, the pool's replicas are reverse_proxy's upstreams:
// max_concurrency 1 over 4 upstreams admits 4 at once (the pool used to
// count as one replica, so 1), and a reload to 6 upstreams admits 6.
func TestFlowDefaultsCapacityFollowsTheUpstreams(t *testing.T) {
	startCaddy(t, obviousFlowConfig("fd-cap", "1500ms", 9801, 9802, 9803, 9804))
	in, out := admitted(t, "fd-cap", 7)
	if in != 4 {
		t.Fatalf("4 upstreams × max_concurrency 1: %v requests in flight, want 4", in)
	}
	waitAll(t, out, 7)

	reload(t, obviousFlowConfig("fd-cap", "1500ms", 9801, 9802, 9803, 9804, 9805, 9806))
	in, out = admitted(t, "fd-cap", 9)
	if in != 6 {
		t.Fatalf("after a reload to 6 upstreams: %v requests in flight, want 6", in)
	}
	waitAll(t, out, 9)
}

// A tenant flooding the pool gets 429 with Retry-After once the band's
// default queue (a few times the capacity) is full, instead of queuing for
// the whole TTL; a quiet tenant arriving behind the flood is served next
// (round robin), before the flood's queue has drained.
func TestFlowDefaultsServeTheQuietTenantAndRefuseTheFlood(t *testing.T) {
	startCaddy(t, obviousFlowConfig("fd-nn", "300ms", 9811, 9812, 9813, 9814))
	const flood = 60
	var mu sync.Mutex
	floodOK, refused := 0, 0
	var wg sync.WaitGroup
	for i := 0; i < flood; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := tenantPost("flood")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case o.status == 200:
				floodOK++
			case o.status == 429:
				refused++
				if o.retryAfter == "" || o.errType != "flow_capacity" {
					t.Errorf("429 with Retry-After %q, type %q; want both (flow_capacity)", o.retryAfter, o.errType)
				}
			default:
				t.Errorf("flood request: %d %s %v (want 200 or 429 at once, never a wait for the TTL)", o.status, o.errType, o.err)
			}
		}()
	}
	eventually(t, "the flood to fill the pool and the band", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return refused > 0 && flowGauge(t, "inference_extension_flow_control_queue_size", "fd-nn") > 0
	})
	quiet := tenantPost("quiet")
	mu.Lock()
	servedBefore := floodOK
	mu.Unlock()
	wg.Wait()
	if quiet.status != 200 {
		t.Fatalf("quiet tenant: %d %s %v", quiet.status, quiet.errType, quiet.err)
	}
	if servedBefore >= floodOK {
		t.Fatalf("the quiet tenant was served after the whole flood (%d flood requests served before it, %d in all): "+
			"it must get the next turn", servedBefore, floodOK)
	}
	if refused == 0 || floodOK+refused != flood {
		t.Fatalf("flood: %d served, %d refused of %d", floodOK, refused, flood)
	}
	t.Logf("flood: %d served, %d refused with 429; quiet served with %d flood requests still to finish", floodOK, refused, floodOK-servedBefore)
}

// When flow control cannot know the replica count, the config is refused
// with a message naming what to add; replicas N makes it load.
func TestFlowDefaultsRefuseAnUncountablePool(t *testing.T) {
	startCaddy(t, obviousFlowConfig("fd-ok", "10ms", 9821))
	site := func(flowOpts, proxy string) string {
		return globals + fmt.Sprintf(`
:9991 {
	bind 127.0.0.1
	flow_control fd-dyn {
		max_concurrency 1
		%s
	}
	reverse_proxy {
		%s
	}
}
`, flowOpts, proxy)
	}
	dynamicA := "dynamic a localhost 9822"
	if status, body := load(t, adapt(t, site("", dynamicA))); status == 200 || !strings.Contains(body, "no replicas known") ||
		!strings.Contains(body, "replicas N") {
		t.Fatalf("dynamic upstreams flow control cannot count: %d %s; want a refusal naming replicas N", status, body)
	}
	if status, body := load(t, adapt(t, site("", "dynamic custom_router other-pool"))); status == 200 || !strings.Contains(body, "other-pool") {
		t.Fatalf("upstreams of another pool: %d %s; want a refusal naming it", status, body)
	}
	// The refused loads left the running config serving.
	if o := tenantPost("t"); o.status != 200 {
		t.Fatalf("after refused loads: %d %v", o.status, o.err)
	}
	if status, body := load(t, adapt(t, site("replicas 4", dynamicA))); status != 200 {
		t.Fatalf("with replicas 4: %d %s", status, body)
	}
}
