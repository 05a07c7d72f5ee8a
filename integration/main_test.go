// Package integration runs Sluice inside a real Caddy (caddytest), in
// front of simulated replicas served by the same process, and checks what
// users depend on: queueing at the edge, draining to new replicas,
// overload answers, hot reload, and counters that return to zero.
package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sluice-router/sluice"
	"github.com/sluice-router/sluice/caddymodule"
	"github.com/sluice-router/sluice/lb/redistest"
	"github.com/sluice-router/sluice/sim"
)

const adminURL = "http://localhost:2999"

func TestMain(m *testing.M) {
	// caddytest drives this process's Caddy through the admin port 2999.
	// A second run of this package at the same time would load its
	// configs into ours and ours into its (502s, refused connections,
	// replicas missing from the registry in both): refuse to start.
	if l, err := net.Listen("tcp", "localhost:2999"); err != nil {
		fmt.Fprintf(os.Stderr, "integration: Caddy's admin port localhost:2999 is taken (%v): is another run of these tests going on? "+
			"Run them one at a time (flock /tmp/sluice-integration.lock go test ./integration/).\n", err)
		os.Exit(2)
	} else {
		l.Close()
	}
	// Keep Caddy's autosave and the persisted backend sets out of $HOME.
	dir, err := os.MkdirTemp("", "sluice-integration-")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_DATA_HOME", dir+"/data")
	os.Setenv("XDG_CONFIG_HOME", dir+"/config")
	code := redistest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// client has a generous timeout: a hung request fails the test rather
// than hanging it; no assertion depends on timing.
var client = &http.Client{Timeout: 30 * time.Second}

func startCaddy(t testing.TB, caddyfile string) {
	t.Helper()
	tester := caddytest.NewTester(t)
	tester.InitServer(caddyfile, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	oldListenersClosed(t)
}

// reload posts a new config to the admin API, the way users hot-reload.
func reload(t *testing.T, caddyfile string) {
	t.Helper()
	if status, body := load(t, adapt(t, caddyfile)); status != 200 {
		t.Fatalf("reload: %d %s", status, body)
	}
	// The old config's servers close their idle connections as they shut
	// down: a request sent on one of those at that moment reads EOF (a GET
	// already written is not retried). CI: "Get .../list_workers: EOF"
	// right after a reload. The next requests dial the new servers.
	client.CloseIdleConnections()
}

func adapt(t *testing.T, caddyfile string) []byte {
	t.Helper()
	cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapt: %v %v", err, warn)
	}
	return cfg
}

// load posts cfg to the admin API's /load and returns Caddy's answer.
func load(t *testing.T, cfg []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, adminURL+"/load", bytes.NewReader(cfg))
	req.Header.Set("Content-Type", "application/json")
	// No retry: every load waits below until the admin endpoint it
	// replaced has closed its listener, so this one reaches the running
	// endpoint (a connection on the old one read EOF in CI).
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// Also after a refused config: it may have started its servers (and
	// admin endpoint) before it was refused, and they are shutting down.
	oldListenersClosed(t)
	// A changed config replaces the servers: the old ones close their idle
	// keep-alive connections, and reusing one would read EOF.
	client.CloseIdleConnections()
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// oldListenersClosed waits until no address has two listening sockets in
// this process, so that a connection made next reaches the running
// config. On Linux Caddy binds each config's listeners anew with
// SO_REUSEPORT (listen_unix.go): across a load the new config's socket and
// the old config's are both open on each port, and the kernel hands a new
// connection to either. The old server closes its socket in a Shutdown
// goroutine that /load does not wait for (nor the admin endpoint's, nor a
// refused config's that had started): a connection that lands on it is
// reset if still in its backlog when it closes, or answered with a bare
// close (EOF) if net/http read its request after Shutdown began. The
// replicas here are sites of the same config, so the proxy's first
// request after a reload could meet that: a 502 "EOF" (CI), as could the
// test's own request to a front site. A proxy reload leaves replicas in
// another process alone.
func oldListenersClosed(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		dup, err := sharedListenAddrs()
		if err != nil {
			// Not Linux: nothing to observe (listen_other_test.go).
			return
		}
		if len(dup) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replaced config's listeners are still open on %v", dup)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type outcome struct {
	status     int
	replica    string
	retryAfter string
	errType    string
	err        error
}

func complete(url string) outcome {
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hello","max_tokens":4}`))
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	o := outcome{status: resp.StatusCode, replica: resp.Header.Get("X-Sim-Replica"), retryAfter: resp.Header.Get("Retry-After")}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		var e struct {
			Error struct{ Type string } `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil {
			o.errType = e.Error.Type
		}
	}
	return o
}

// burst sends n requests at once and returns a channel of their outcomes.
func burst(url string, n int) <-chan outcome {
	out := make(chan outcome, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out <- complete(url)
		}()
	}
	go func() { wg.Wait(); close(out) }()
	return out
}

type health struct {
	OK         bool `json:"ok"`
	QueueDepth int  `json:"queue_depth"`
	Backends   []struct {
		Addr        string  `json:"addr"`
		EWMALatency float64 `json:"ewma_latency"`
		Tried       bool    `json:"tried"`
		InFlight    int     `json:"in_flight"`
		Parallelism int     `json:"parallelism"`
		Down        bool    `json:"down"`
		Failures    uint64  `json:"failures"`
		Dispatched  uint64  `json:"dispatched"`
	} `json:"backends"`
}

func getHealth(t *testing.T, url string) health {
	t.Helper()
	resp, err := client.Get(url + "/_custom_router/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("health: %d", resp.StatusCode)
	}
	var h health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

func inFlight(h health) int {
	n := 0
	for _, b := range h.Backends {
		n += b.InFlight
	}
	return n
}

func setBackends(t testing.TB, url string, backends ...string) {
	t.Helper()
	if backends == nil {
		backends = []string{} // "no backends", not a missing field
	}
	body, _ := json.Marshal(map[string]any{"backends": backends})
	// Not retried: the loads wait until the replaced servers' listeners
	// are closed (oldListenersClosed), so this reaches the running config.
	resp, err := client.Post(url+"/_custom_router/set-backends", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("set-backends: %d %s", resp.StatusCode, msg)
	}
}

// eventually polls cond; the deadline only keeps a broken test from hanging.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// drained asserts the invariant after every burst: nothing queued, nothing
// counted in flight.
func drained(t *testing.T, url string) {
	t.Helper()
	eventually(t, "queue and in-flight counts to return to zero", func() bool {
		h := getHealth(t, url)
		return h.QueueDepth == 0 && inFlight(h) == 0
	})
}

// simReplica is the running inference_sim replica named name; the test
// fails (instead of panicking the whole run) when none is.
func simReplica(t testing.TB, name string) *sim.Replica {
	t.Helper()
	r := caddymodule.InferenceSimReplica(name)
	if r == nil {
		t.Fatalf("no inference_sim replica named %q is running", name)
	}
	return r
}

func sims(ports ...int) string {
	var b strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&b, `
:%d {
	bind 127.0.0.1
	inference_sim {
		name sim-%d
		concurrency 1
		latency fixed 150ms
	}
}
`, p, p)
	}
	return b.String()
}

const globals = `{
	admin localhost:2999
	http_port 9080
	https_port 9443
	persist_config off
}
`

func decodeJSON(resp *http.Response, v any) error {
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
