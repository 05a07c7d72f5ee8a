package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func flowConfig(port int, pool, flowOpts string, simPort int, simLatency string) string {
	return globals + fmt.Sprintf(`
:%d {
	custom_router %s
	flow_control %s {
		%s
	}
	reverse_proxy {
		dynamic custom_router %s
		lb_policy least_conn
	}
}
:%d {
	bind 127.0.0.1
	inference_sim {
		name fc-%d
		concurrency 1
		latency fixed %s
	}
}
`, port, pool, pool, flowOpts, pool, simPort, simPort, simLatency)
}

func postWith(url string, header map[string]string) (*http.Response, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":2}`))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return client.Do(req)
}

func TestFlowControlPriorityServesPremiumFirst(t *testing.T) {
	startCaddy(t, flowConfig(9850, "fc-prio", `trusted_sources 127.0.0.1/32
		objective premium 100
		objective batch -10
		max_concurrency 1`, 9851, "200ms"))
	url := "http://127.0.0.1:9850"
	setBackends(t, url, "http://127.0.0.1:9851")

	type res struct {
		kind string
		seq  string
	}
	out := make(chan res, 8)
	var wg sync.WaitGroup
	send := func(kind string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := postWith(url, map[string]string{"X-Gateway-Inference-Objective": kind})
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			out <- res{kind, resp.Header.Get("X-Sim-Seq")}
		}()
	}
	for i := 0; i < 6; i++ {
		send("batch")
		time.Sleep(10 * time.Millisecond) // arrive in order, all queued behind the first
	}
	send("premium")
	wg.Wait()
	close(out)
	for r := range out {
		if r.kind == "premium" && r.seq != "2" {
			t.Fatalf("premium request was served %sth; it must come right after the one in flight", r.seq)
		}
	}
}

func TestFlowControlCapacityAnswers429AndLosesNothing(t *testing.T) {
	startCaddy(t, flowConfig(9860, "fc-cap", `max_concurrency 1
		band 0 {
			max_requests 2
		}`, 9861, "300ms"))
	url := "http://127.0.0.1:9860"
	setBackends(t, url, "http://127.0.0.1:9861")
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := postWith(url, nil)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			if resp.StatusCode == 429 && resp.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			mu.Unlock()
		}()
		time.Sleep(15 * time.Millisecond)
	}
	wg.Wait()
	if codes[200] != 3 || codes[429] != 3 {
		t.Fatalf("codes %v: 1 in flight + 2 queued are served, the other 3 get 429 at once", codes)
	}
	if m := metricsText(t, url); !strings.Contains(m, `inference_extension_flow_control_pool_saturation{inference_pool="fc-cap"}`) {
		t.Errorf("flow control metrics missing")
	}
}

func TestFlowControlHeadersAreOnlyTrustedFromTrustedSources(t *testing.T) {
	echo := `
:9872 {
	bind 127.0.0.1
	respond "objective={http.request.header.X-Gateway-Inference-Objective} tenant={http.request.header.X-Gateway-Inference-Fairness-Id}"
}
`
	site := func(port int, pool, trust string) string {
		return fmt.Sprintf(`
:%d {
	custom_router %s {
		backends http://127.0.0.1:9872
	}
	flow_control %s {
		%s
		objective premium 100
	}
	reverse_proxy {
		dynamic custom_router %s
	}
}
`, port, pool, pool, trust, pool)
	}
	startCaddy(t, globals+site(9870, "fc-untrusted", "trusted_sources 10.0.0.0/8")+site(9871, "fc-trusted", "trusted_sources 127.0.0.0/8")+echo)
	get := func(port int) string {
		resp, err := postWith(fmt.Sprintf("http://127.0.0.1:%d", port), map[string]string{
			"X-Gateway-Inference-Objective": "premium", "X-Gateway-Inference-Fairness-Id": "acme"})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get(9870); got != "objective= tenant=" {
		t.Fatalf("untrusted client's headers reached the replica: %q", got)
	}
	if got := get(9871); got != "objective=premium tenant=acme" {
		t.Fatalf("trusted client's headers: %q", got)
	}
}

func TestFlowControlHotReloadKeepsQueuedRequests(t *testing.T) {
	cfg := flowConfig(9880, "fc-reload", `max_concurrency 1
		default_ttl 30s`, 9881, "300ms")
	startCaddy(t, cfg)
	url := "http://127.0.0.1:9880"
	setBackends(t, url, "http://127.0.0.1:9881")
	results := burst(url, 5)
	eventually(t, "requests to queue at the edge", func() bool {
		for _, l := range strings.Split(grepLines(metricsText(t, url), "inference_extension_flow_control_queue_size{"), "\n") {
			if strings.HasSuffix(l, " 4") {
				return true
			}
		}
		return false
	})
	reload(t, strings.Replace(cfg, "default_ttl 30s", "default_ttl 20s", 1))
	n := 0
	for o := range results {
		if o.err != nil || o.status != 200 {
			t.Fatalf("a request queued across the reload failed: %+v", o)
		}
		n++
	}
	if n != 5 {
		t.Fatalf("%d answers, want 5", n)
	}
}
