package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func cacheAwareConfig(port int, pool, extra string, simPorts ...int) string {
	return globals + fmt.Sprintf(`
:%d {
	custom_router %s
	reverse_proxy {
		dynamic custom_router %s
		lb_policy cache_aware {
			pool %s
			%s
		}
	}
}
`, port, pool, pool, pool, extra) + sims(simPorts...)
}

func chat(url, system, question string) outcome {
	body, _ := json.Marshal(map[string]any{
		"model": "m",
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": question},
		},
		"max_tokens": 4,
	})
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	return outcome{status: resp.StatusCode, replica: resp.Header.Get("X-Sim-Replica")}
}

func TestSharedSystemPromptSticksToOneReplicaWhileBalanced(t *testing.T) {
	startCaddy(t, cacheAwareConfig(9310, "ca-stick", "", 9311, 9312, 9313))
	url := "http://127.0.0.1:9310"
	setBackends(t, url, "http://127.0.0.1:9311", "http://127.0.0.1:9312", "http://127.0.0.1:9313")
	system := strings.Repeat("You are a careful assistant who answers in French. ", 40)
	first := chat(url, system, "What is a sluice?")
	if first.status != 200 {
		t.Fatalf("first: %+v", first)
	}
	for i := 0; i < 12; i++ {
		o := chat(url, system, fmt.Sprintf("Question number %d?", i))
		if o.status != 200 || o.replica != first.replica {
			t.Fatalf("request %d went to %s (status %d), want the replica holding the prefix, %s", i, o.replica, o.status, first.replica)
		}
	}
	// Another system prompt is a miss: least load spreads new prefixes.
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		o := chat(url, fmt.Sprintf("Prompt family %d: %s", i, strings.Repeat("z", 500)), "hi")
		if o.status != 200 {
			t.Fatalf("miss: %+v", o)
		}
		seen[o.replica] = true
	}
	if len(seen) < 2 {
		t.Fatalf("six new prefixes all went to %v: misses must spread", seen)
	}
	m := metricsText(t, url)
	if !strings.Contains(m, `sluice_cache_aware_decisions_total{pool="ca-stick",reason="cache_hit"} 12`) {
		t.Errorf("metrics lack 12 cache hits:\n%s", grepLines(m, "sluice_cache_aware"))
	}
	drained(t, url)
}

func TestFloodThatImbalancesThePoolSpreads(t *testing.T) {
	startCaddy(t, cacheAwareConfig(9320, "ca-flood", "balance_abs_threshold 2", 9321, 9322, 9323))
	url := "http://127.0.0.1:9320"
	setBackends(t, url, "http://127.0.0.1:9321", "http://127.0.0.1:9322", "http://127.0.0.1:9323")
	system := strings.Repeat("Shared context for every request in the flood. ", 40)
	if o := chat(url, system, "warm up"); o.status != 200 {
		t.Fatalf("warm-up: %+v", o)
	}
	var mu sync.Mutex
	served := map[string]int{}
	var wg sync.WaitGroup
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			o := chat(url, system, fmt.Sprintf("q%d", i))
			mu.Lock()
			defer mu.Unlock()
			if o.status != 200 {
				t.Errorf("flood request: %+v", o)
			}
			served[o.replica]++
		}(i)
	}
	wg.Wait()
	if len(served) < 3 {
		t.Fatalf("flood served by %v: an imbalanced pool must spread to every replica", served)
	}
	if m := metricsText(t, url); !strings.Contains(m, `reason="imbalance"`) {
		t.Errorf("no imbalance decision recorded:\n%s", grepLines(m, "sluice_cache_aware"))
	}
	drained(t, url)
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestBodiesSluiceCannotReadStillReachTheReplicaUnchanged(t *testing.T) {
	startCaddy(t, cacheAwareConfig(9330, "ca-body", "max_body_bytes 1024", 9331, 9332))
	url := "http://127.0.0.1:9330"
	setBackends(t, url, "http://127.0.0.1:9331", "http://127.0.0.1:9332")

	// Over the bound: routed by load alone, and the replica counts every
	// prompt token (~4 chars each), so it got the whole body.
	prompt := strings.Repeat("abcd", 2000)
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != 200 || out.Usage.PromptTokens != 2000 {
		t.Fatalf("large body: status %d, replica saw %d prompt tokens, want 2000", resp.StatusCode, out.Usage.PromptTokens)
	}

	// Not JSON: Sluice routes it by load; the replica itself answers 400.
	resp, err = client.Post(url+"/v1/completions", "application/json", strings.NewReader("{not json"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 || resp.Header.Get("X-Sim-Replica") == "" {
		t.Fatalf("bad JSON: got %d from %q, want the replica's own 400", resp.StatusCode, resp.Header.Get("X-Sim-Replica"))
	}
	drained(t, url)
}

func TestSGLangWorkerAPIChangesTheSameSet(t *testing.T) {
	startCaddy(t, cacheAwareConfig(9340, "ca-workers", "", 9341, 9342))
	url := "http://127.0.0.1:9340"
	setBackends(t, url, "http://127.0.0.1:9341")
	post := func(path string) int {
		resp, err := client.Post(url+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := post("/add_worker?url=http://127.0.0.1:9342"); s != 200 {
		t.Fatalf("add_worker: %d", s)
	}
	if s := post("/add_worker?url=not-a-url"); s != 400 {
		t.Fatalf("add_worker with a bad url: %d, want 400", s)
	}
	resp, err := client.Get(url + "/list_workers")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ URLs []string }
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.URLs) != 2 {
		t.Fatalf("list_workers: %v", list.URLs)
	}
	if h := getHealth(t, url); len(h.Backends) != 2 {
		t.Fatalf("set-backends view after add_worker: %+v", h.Backends)
	}
	if s := post("/remove_worker?url=http://127.0.0.1:9341"); s != 200 {
		t.Fatalf("remove_worker: %d", s)
	}
	if s := post("/remove_worker?url=http://127.0.0.1:9341"); s != 404 {
		t.Fatalf("removing an absent worker: %d, want 404", s)
	}
	for i := 0; i < 4; i++ {
		if o := chat(url, "sys", fmt.Sprint(i)); o.status != 200 || o.replica != "sim-9342" {
			t.Fatalf("after remove_worker: %+v", o)
		}
	}
}
