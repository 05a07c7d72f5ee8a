package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"net/http"
	"strings"
	"testing"
)

func TestSessionAffinityRoundTripThroughCaddy(t *testing.T) {
	startCaddy(t, globals+`
:9610 {
	custom_router la-session
	reverse_proxy {
		dynamic custom_router la-session
		lb_policy load_aware {
			pool la-session
			# session_affinity is not among the default scorers: a user
			# who wants sessions names it (with the defaults beside it).
			scorer session_affinity
			scorer active_request
			scorer active_tokens
			metrics_interval 100ms
			# The test is about the session round trip: a scrape that
			# runs late on a loaded machine must not make the session's
			# replica stale (stale metrics score worst, by design).
			metrics_staleness 30s
		}
	}
}
`+sims(9611, 9612, 9613))
	url := "http://127.0.0.1:9610"
	setBackends(t, url, "http://127.0.0.1:9611", "http://127.0.0.1:9612", "http://127.0.0.1:9613")

	history := strings.Repeat("user: tell me more about sluices. assistant: they control water. ", 4)
	post := func(token string) (replica, newToken string) {
		// A multi-turn session resends its history: the prompt is hot.
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"`+history+`","max_tokens":2}`))
		if token != "" {
			req.Header.Set("X-Session-Token", token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.Header.Get("X-Sim-Replica"), resp.Header.Get("X-Session-Token")
	}
	first, token := post("")
	if token == "" || strings.Contains(token, "127.0.0.1") {
		t.Fatalf("session token %q: want an opaque token", token)
	}
	for i := 0; i < 8; i++ {
		replica, again := post(token)
		if replica != first || again != token {
			t.Fatalf("request %d with the session token went to %s (token %q), want %s", i, replica, again, first)
		}
	}
	// Without the token, idle replicas share the load (random ties).
	seen := map[string]bool{}
	for i := 0; i < 12; i++ {
		r, _ := post("")
		seen[r] = true
	}
	if len(seen) < 2 {
		t.Fatalf("requests without a session all went to %v", seen)
	}
	drained(t, url)
}

func TestLoadAwareAvoidsAReplicaWhoseMetricsSayItIsQueued(t *testing.T) {
	// 9622 is one-at-a-time and held busy by slow requests: its own
	// metrics show a queue, so queue/load_aware scorers steer away from it.
	startCaddy(t, globals+`
:9620 {
	custom_router la-queue
	reverse_proxy {
		dynamic custom_router la-queue
		lb_policy load_aware {
			pool la-queue
			scorer queue
			scorer load_aware
			metrics_interval 50ms
		}
	}
}
:9621 {
	bind 127.0.0.1
	inference_sim {
		name la-fast
		concurrency 8
		latency fixed 20ms
	}
}
:9622 {
	bind 127.0.0.1
	inference_sim {
		name la-jammed
		concurrency 1
		latency fixed 3s
	}
}
`)
	url := "http://127.0.0.1:9620"
	// Jam 9622 directly (not through Sluice) so only its metrics tell.
	for i := 0; i < 3; i++ {
		go func() {
			resp, err := client.Post("http://127.0.0.1:9622/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	setBackends(t, url, "http://127.0.0.1:9621", "http://127.0.0.1:9622")
	eventually(t, "the scraper to see the jammed replica's queue", func() bool {
		resp, err := client.Get(url + "/_custom_router/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var h struct {
			Backends []struct {
				Addr    string
				Metrics *struct {
					Freshness string
					Waiting   *float64
				}
			}
		}
		if json.NewDecoder(resp.Body).Decode(&h) != nil || len(h.Backends) != 2 {
			return false
		}
		for _, b := range h.Backends {
			if b.Metrics == nil || b.Metrics.Freshness != "fresh" || b.Metrics.Waiting == nil {
				return false
			}
		}
		return *h.Backends[1].Metrics.Waiting >= 2
	})
	for i := 0; i < 10; i++ {
		if o := complete(url); o.status != 200 || o.replica != "la-fast" {
			t.Fatalf("request %d: %+v — a replica whose metrics show a queue must lose", i, o)
		}
	}
}

func TestLoadAwareRetriesOnTheFallbackEndpoint(t *testing.T) {
	startCaddy(t, globals+`
:9630 {
	custom_router la-retry
	reverse_proxy {
		dynamic custom_router la-retry
		lb_retries 1
		lb_policy load_aware {
			pool la-retry
			max_num_endpoints 2
			fail_duration 1m
		}
	}
}
`+sims(9631))
	url := "http://127.0.0.1:9630"
	// 9639 refuses connections; picks are random among equal scores, so
	// some first picks hit it and must be retried on the fallback.
	setBackends(t, url, "http://127.0.0.1:9639", "http://127.0.0.1:9631")
	for i := 0; i < 8; i++ {
		if o := complete(url); o.status != 200 || o.replica != "sim-9631" {
			t.Fatalf("request %d: %+v", i, o)
		}
	}
	h := getHealth(t, url)
	if h.Backends[0].Failures > 1 || (h.Backends[0].Failures == 1 && !h.Backends[0].Down) {
		t.Fatalf("dead replica %+v: at most one failure, then down", h.Backends[0])
	}
	drained(t, url)
}

// A burst whose bodies arrive slowly: every pick must still see the counts
// of the picks made while its body was arriving (the body is read first,
// then the replicas are ranked), or the whole burst lands on one replica.
func TestLoadAwareBurstWithSlowBodiesSpreads(t *testing.T) {
	var sites strings.Builder
	for p := 9641; p <= 9644; p++ {
		fmt.Fprintf(&sites, "\n:%d {\n\tbind 127.0.0.1\n\tinference_sim {\n\t\tname slow-%d\n\t\tconcurrency 64\n\t\tlatency fixed 1s\n\t}\n}\n", p, p)
	}
	startCaddy(t, globals+`
:9640 {
	reverse_proxy 127.0.0.1:9641 127.0.0.1:9642 127.0.0.1:9643 127.0.0.1:9644 {
		lb_policy load_aware {
			pool la-slow
		}
	}
}
`+sites.String())
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pr, pw := io.Pipe()
			go func() {
				fmt.Fprintf(pw, `{"prompt":"request %d `, i)
				time.Sleep(300 * time.Millisecond) // the rest of the body comes later
				fmt.Fprint(pw, `tail","max_tokens":2}`)
				pw.Close()
			}()
			req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:9640/v1/completions", pr)
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}(i)
	}
	wg.Wait()
	for p := 9641; p <= 9644; p++ {
		if n := simReplica(t, fmt.Sprintf("slow-%d", p)).Stats().Requests; n < 3 || n > 7 {
			t.Fatalf("replica %d got %d of 20 concurrent requests, want about 5", p, n)
		}
	}
}

// With active_tokens, one long generation in flight outweighs several
// short ones: every short request goes to the other replica, where
// active_request would alternate (1 vs 1, 1 vs 2…).
func TestActiveTokensWeighsRequestsBySize(t *testing.T) {
	var sites strings.Builder
	for p := 9651; p <= 9652; p++ {
		fmt.Fprintf(&sites, "\n:%d {\n\tbind 127.0.0.1\n\tinference_sim {\n\t\tname tok-%d\n\t\tconcurrency 64\n\t\tlatency fixed 3s\n\t}\n}\n", p, p)
	}
	startCaddy(t, globals+`
:9650 {
	reverse_proxy 127.0.0.1:9651 127.0.0.1:9652 {
		lb_policy load_aware {
			pool la-tokens
			scorer active_tokens
		}
	}
}
`+sites.String())
	started := func() uint64 {
		return simReplica(t, "tok-9651").Stats().Started + simReplica(t, "tok-9652").Stats().Started
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		replicas []string
	)
	send := func(body string) {
		want := started() + 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post("http://127.0.0.1:9650/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			replicas = append(replicas, resp.Header.Get("X-Sim-Replica"))
			mu.Unlock()
		}()
		// In flight before the next one is picked.
		eventually(t, "the request to reach a replica", func() bool { return started() >= want })
	}
	send(`{"prompt":"` + strings.Repeat("long context ", 300) + `","max_tokens":2000}`) // ~3000 tokens
	for i := 0; i < 6; i++ {
		send(fmt.Sprintf(`{"prompt":"short %d","max_tokens":16}`, i)) // ~18 tokens each
	}
	wg.Wait()
	heavy := replicas[0]
	n := map[string]int{}
	for _, r := range replicas {
		n[r]++
	}
	// Answers arrive in any order; the heavy one is the only request on
	// its replica.
	for r, c := range n {
		if c == 1 {
			heavy = r
		}
	}
	if len(n) != 2 || n[heavy] != 1 {
		t.Fatalf("requests per replica %v: want the 6 short requests all away from the long one", n)
	}
}
