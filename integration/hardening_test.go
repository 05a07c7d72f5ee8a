package integration

import (
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Regression tests, through a real Caddy, for hardening fixes that were
// first tested only below Caddy. Ports 9960–9989.

// adminGauge reads one sample of the admin endpoint's /metrics: the line
// that starts with series (name plus labels, as Prometheus prints it).
func adminGauge(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := client.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return v
		}
	}
	return 0
}

func postBody(url, body string, chunked bool) outcome {
	var r io.Reader = strings.NewReader(body)
	if chunked {
		r = io.MultiReader(r) // a reader of unknown length: sent chunked
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", r)
	req.Header.Set("Content-Type", "application/json")
	if chunked {
		req.ContentLength = -1
	}
	resp, err := client.Do(req)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	o := outcome{status: resp.StatusCode, replica: resp.Header.Get("X-Sim-Replica"), retryAfter: resp.Header.Get("Retry-After")}
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct{ Type string } `json:"error"`
	}
	if resp.StatusCode >= 400 && json.Unmarshal(b, &e) == nil {
		o.errType = e.Error.Type
	}
	return o
}

// A client's max_tokens of 4e18 used to weigh 4e18 tokens in flow
// control's tokens mode: while it ran, the pool's token gate (2 replicas ×
// 1,000,000) stayed closed and every other request queued until its TTL.
// The estimate is capped now (1 Mi tokens), so others still get in.
//
// The body names max_completion_tokens too: the simulated replica (like an
// engine) uses that one and serves the request; Sluice's completions
// parser weighs max_tokens, the value a hostile client controls.
func TestHugeMaxTokensDoesNotCloseTheTokenGate(t *testing.T) {
	startCaddy(t, globals+`
:9960 {
	bind 127.0.0.1
	custom_router hd-tokens
	flow_control hd-tokens {
		concurrency_mode tokens
		default_ttl      1s
	}
	reverse_proxy {
		dynamic custom_router hd-tokens
		lb_policy least_conn
	}
}
:9961 {
	bind 127.0.0.1
	inference_sim {
		name sim-9961
		concurrency 4
		latency fixed 3s
	}
}
:9962 {
	bind 127.0.0.1
	inference_sim {
		name sim-9962
		concurrency 4
		latency fixed 3s
	}
}
`)
	url := "http://127.0.0.1:9960"
	setBackends(t, url, "http://127.0.0.1:9961", "http://127.0.0.1:9962")
	inflight := `sluice_flow_control_inflight_requests{inference_pool="hd-tokens"}`

	huge := make(chan outcome, 1)
	go func() {
		huge <- postBody(url, `{"prompt":"hi","max_completion_tokens":4,"max_tokens":4000000000000000000}`, false)
	}()
	eventually(t, "the huge request to be in flight", func() bool { return adminGauge(t, inflight) == 1 })
	// Its 3 s of service outlast the 1 s a queued request may wait: had it
	// closed the gate, this one would get 503 queue_ttl.
	if o := postBody(url, `{"prompt":"hi","max_tokens":4}`, false); o.err != nil || o.status != 200 {
		t.Fatalf("a small request while a max_tokens 4e18 one runs: %+v, want 200", o)
	}
	if o := <-huge; o.err != nil || o.status != 200 {
		t.Fatalf("the huge request: %+v, want 200 (served with 4 output tokens)", o)
	}
	eventually(t, "flow control's in-flight gauge to return to 0", func() bool { return adminGauge(t, inflight) == 0 })
}

// A body sent without Content-Length (chunked) used to count against
// max_bytes as its prompt's length: 8 KB of other fields around a 2-byte
// prompt queued under a 4 kB limit. It counts what flow control buffered
// now, like the same body with a Content-Length.
func TestChunkedBodyCountsAgainstMaxBytes(t *testing.T) {
	startCaddy(t, globals+`
:9963 {
	bind 127.0.0.1
	custom_router hd-bytes
	flow_control hd-bytes {
		max_concurrency 1
		max_bytes       4k
	}
	reverse_proxy {
		dynamic custom_router hd-bytes
		lb_policy least_conn
	}
}
:9964 {
	bind 127.0.0.1
	inference_sim {
		name sim-9964
		concurrency 1
		latency fixed 2s
	}
}
`)
	url := "http://127.0.0.1:9963"
	setBackends(t, url, "http://127.0.0.1:9964")
	inflight := `sluice_flow_control_inflight_requests{inference_pool="hd-bytes"}`

	holder := make(chan outcome, 1)
	go func() { holder <- postBody(url, `{"prompt":"hold","max_tokens":2}`, false) }()
	eventually(t, "the first request to hold the only slot", func() bool { return adminGauge(t, inflight) == 1 })

	big := `{"prompt":"hi","max_tokens":2,"user":"` + strings.Repeat("x", 8000) + `"}`
	for _, chunked := range []bool{false, true} {
		if o := postBody(url, big, chunked); o.err != nil || o.status != 429 {
			t.Errorf("8 kB body (chunked %t) that would queue under max_bytes 4k: %+v, want 429", chunked, o)
		}
	}
	// A small chunked body still queues and is served.
	if o := postBody(url, `{"prompt":"small","max_tokens":2}`, true); o.err != nil || o.status != 200 {
		t.Errorf("small chunked body: %+v, want 200", o)
	}
	if o := <-holder; o.status != 200 {
		t.Errorf("the first request: %+v", o)
	}
	eventually(t, "flow control's in-flight gauge to return to 0", func() bool { return adminGauge(t, inflight) == 0 })
}

func listWorkers(t *testing.T, url string) []string {
	t.Helper()
	resp, err := client.Get(url + "/list_workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct{ URLs []string }
	if err := decodeJSON(resp, &v); err != nil {
		t.Fatal(err)
	}
	slices.Sort(v.URLs)
	return v.URLs
}

// Concurrent set-backends and add_worker calls: each must apply whole
// (the set is the new one, with or without the added worker — never an
// older set with the worker added back), and the persisted file, which a
// restart restores, must hold exactly the live set. Unserialized, the two
// writers' file writes could land in the other order than their changes,
// and add_worker's read-modify-write could undo a set-backends.
func TestConcurrentBackendChangesPersistTheFinalSet(t *testing.T) {
	cfg := func(pool string) string {
		return globals + `
:9966 {
	bind 127.0.0.1
	route {
		custom_router ` + pool + `
		respond "no proxy here"
	}
}
`
	}
	startCaddy(t, cfg("hd-persist"))
	url := "http://127.0.0.1:9966"
	file := filepath.Join(caddy.AppDataDir(), "sluice", "pools", "hd-persist.json")
	readFile := func() []string {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var pp struct{ Backends []string }
		if err := json.Unmarshal(data, &pp); err != nil {
			t.Fatal(err)
		}
		slices.Sort(pp.Backends)
		return pp.Backends
	}
	backend := func(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) }
	var live []string
	for round := 0; round < 60; round++ {
		set := []string{backend(9980 + round%4), backend(9984 + round%3)}
		worker := backend(9987 + round%3)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); setBackends(t, url, set...) }()
		go func() {
			defer wg.Done()
			resp, err := client.Post(url+"/add_worker?url="+worker, "", nil)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("add_worker: %d", resp.StatusCode)
			}
		}()
		wg.Wait()
		live = listWorkers(t, url)
		slices.Sort(set)
		withWorker := slices.Sorted(slices.Values(append(slices.Clone(set), worker)))
		if !slices.Equal(live, set) && !slices.Equal(live, withWorker) {
			t.Fatalf("round %d: live set %v, want %v or %v (a change was lost)", round, live, set, withWorker)
		}
		if f := readFile(); !slices.Equal(f, live) {
			t.Fatalf("round %d: persisted %v, live %v: a restart would restore another set", round, f, live)
		}
	}
	// A restart restores the file: the first module naming a pool after
	// start-up reads <pool>.json, so the file is restored under a fresh
	// pool name by a reload, as it would be by a restarted process (a name
	// of this run's own: pools outlive configs in this process, -count).
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	restarted := fmt.Sprintf("hd-persist-restart-%d", time.Now().UnixNano())
	if err := os.WriteFile(filepath.Join(filepath.Dir(file), restarted+".json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	reload(t, cfg(restarted))
	if got := listWorkers(t, url); !slices.Equal(got, live) {
		t.Fatalf("restored %v, want the final set %v", got, live)
	}
}

// Session tokens are keyed HMACs: two servers with the same session_key
// honour each other's tokens (the HF-style fleet of proxies), the token is
// not the plain hash of the replica's address anyone can compute, and a
// server with another key does not honour it.
func TestSessionTokensAreKeyedAndSharedByKey(t *testing.T) {
	site := func(port int, pool, key string) string {
		return fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	custom_router %s
	reverse_proxy {
		dynamic custom_router %s
		lb_policy load_aware {
			pool %s
			# Only the session decides: without a token honoured, ties are random.
			scorer session_affinity
			session_key %s
			metrics_interval 100ms
			metrics_staleness 30s
		}
	}
}
`, port, pool, pool, pool, key)
	}
	startCaddy(t, globals+site(9970, "hd-sess-a", "fleet-secret-1")+site(9971, "hd-sess-b", "fleet-secret-1")+
		site(9972, "hd-sess-c", "another-secret")+sims(9973, 9974, 9975))
	replicas := []string{"http://127.0.0.1:9973", "http://127.0.0.1:9974", "http://127.0.0.1:9975"}
	for _, port := range []int{9970, 9971, 9972} {
		setBackends(t, fmt.Sprintf("http://127.0.0.1:%d", port), replicas...)
	}
	postTo := func(port int, token string) (replica, newToken string) {
		req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/completions", port),
			strings.NewReader(`{"prompt":"hello again","max_tokens":2}`))
		if token != "" {
			req.Header.Set("X-Session-Token", token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("port %d: status %d", port, resp.StatusCode)
		}
		return resp.Header.Get("X-Sim-Replica"), resp.Header.Get("X-Session-Token")
	}
	first, token := postTo(9970, "")
	if token == "" {
		t.Fatal("no session token")
	}
	// Not a hash anyone can compute from the address (the old scheme, and
	// the obvious ones).
	for _, r := range replicas {
		addr := strings.TrimPrefix(r, "http://")
		for _, plain := range []string{"sluice-session:" + addr, addr, r} {
			sum := sha256.Sum256([]byte(plain))
			for _, enc := range []string{base64.RawURLEncoding.EncodeToString(sum[:12]), base64.RawURLEncoding.EncodeToString(sum[:]),
				hex.EncodeToString(sum[:]), hex.EncodeToString(sum[:12])} {
				if token == enc {
					t.Fatalf("session token %q is the plain SHA-256 of %q", token, plain)
				}
			}
		}
		if strings.Contains(token, addr) {
			t.Fatalf("session token %q reveals the address", token)
		}
	}
	// The other server with the same key honours it, every time.
	for i := 0; i < 8; i++ {
		if replica, again := postTo(9971, token); replica != first || again != token {
			t.Fatalf("same session_key, request %d: went to %s with token %q, want %s with %q", i, replica, again, first, token)
		}
	}
	// Another key: the token names nothing there, so the picks spread
	// (random ties; all 12 on one replica by chance: 3^-11), and that
	// server issues its own tokens.
	seen := map[string]bool{}
	for i := 0; i < 12; i++ {
		replica, theirs := postTo(9972, token)
		if theirs == token {
			t.Fatalf("a server with another session_key issued the same token %q", token)
		}
		seen[replica] = true
	}
	if len(seen) < 2 {
		t.Fatalf("a server with another session_key sent all 12 requests with the token to %v: it honoured the token", seen)
	}
}

// global_redis_least's passive health, through Caddy: in a 2-replica set
// whose second replica is dead (nothing listens), at most max_fails
// requests fail on it; then it is down (fail_duration) and every request
// goes to the live one — in the plain mode and in the queueing mode. It
// had no passive health: ties are random, so about half the requests got
// 502 (15% of all requests in the chaos scenario while replicas were
// killed).
func TestGlobalRedisLeastSkipsADeadReplica(t *testing.T) {
	redis := testRedis(t)
	prefix := fmt.Sprint("hd-", time.Now().UnixNano())
	site := func(port int, pool, extra string) string {
		return fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	custom_router %s
	reverse_proxy {
		dynamic custom_router %s
		lb_policy global_redis_least {
			pool          %s
			redis         %s
			key_prefix    %s
			max_fails     2
			fail_duration 10m
			%s
		}
	}
}
`, port, pool, pool, pool, redis, prefix, extra)
	}
	startCaddy(t, globals+site(9976, "hd-redis-plain", "")+
		site(9977, "hd-redis-queue", "max_inflight 4\n\t\t\tqueue_timeout 20s")+`
:9978 {
	bind 127.0.0.1
	inference_sim {
		name sim-9978
		concurrency 4
	}
}
`)
	for _, port := range []int{9976, 9977} {
		url := fmt.Sprintf("http://127.0.0.1:%d", port)
		setBackends(t, url, "http://127.0.0.1:9978", "http://127.0.0.1:9979")
		failures := 0
		for i := 0; i < 30; i++ {
			o := complete(url)
			switch {
			case o.err != nil:
				t.Fatalf("port %d request %d: %v", port, i, o.err)
			case o.status == 200 && o.replica == "sim-9978":
			case o.status == 502:
				failures++
			default:
				t.Fatalf("port %d request %d: %+v", port, i, o)
			}
		}
		if failures > 2 {
			t.Errorf("port %d: %d of 30 requests failed on the dead replica, want at most max_fails (2)", port, failures)
		}
		drained(t, url)
	}
}
