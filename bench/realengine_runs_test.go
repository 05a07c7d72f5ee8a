package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// quickRealEngine runs real-engine -quick with only the systems named in
// only, over the replicas e says, and fails t unless the run was clean.
// It builds (once) the Caddy it runs; skipped with -short.
func quickRealEngine(t *testing.T, only string, e EngineOptions) *Result {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	bin := caddyForTests(ctx, t)
	res, err := Run(ctx, Options{Scenario: "real-engine", Quick: true, OutDir: t.TempDir(), CaddyBin: bin, Only: only,
		NoInstall: true, Command: "go test ./bench/", Log: testLog{t}, Engine: e})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatalf("run not clean: %v", err)
	}
	return res
}

// promptRecorder stands in front of a replica that outlives the systems'
// runs (as your own endpoints and the transformers replicas do) and
// records the prompt of every completion sent to it.
type promptRecorder struct {
	mu      sync.Mutex
	prompts []recordedPrompt
	// first, if set, runs when the first completion arrives, before it
	// goes on to the replica.
	first     func()
	firstOnce sync.Once
}

type recordedPrompt struct {
	prefixID string
	prompt   string
}

func (pr *promptRecorder) front(t *testing.T, replica string) *httptest.Server {
	u, err := url.Parse(replica)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.FlushInterval = -1 // streamed tokens go on at once
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/completions" {
			body, _ := io.ReadAll(r.Body)
			var req struct {
				Prompt string `json:"prompt"`
			}
			if err := json.Unmarshal(body, &req); err != nil {
				t.Errorf("a completion the replica cannot read: %v", err)
			}
			if pr.first != nil {
				pr.firstOnce.Do(pr.first)
			}
			pr.mu.Lock()
			pr.prompts = append(pr.prompts, recordedPrompt{r.Header.Get("X-Prefix-Id"), req.Prompt})
			pr.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// Replicas that outlive a system's run keep what it left in their prefix
// caches. Sent the same shared prompts, the next system found them cached
// on every replica (on all of them after round robin): it was measured
// on warm replicas, the first on cold ones, and a policy's placement of
// prompts showed in nothing but its first requests. Every system's run
// must send shared prompts of its own, otherwise the same workload: the
// same prompt for each request, the same words after the prompts'
// openings.
func TestNoSystemFindsTheSharedPromptsOfAnother(t *testing.T) {
	rec := &promptRecorder{}
	var endpoints []string
	for i := range 2 {
		// The calibrated engine, ten times faster than real time.
		s, err := sim.Start(engineReplicaConfig(fmt.Sprintf("kept-%d", i), 0.1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		endpoints = append(endpoints, rec.front(t, s.URL()).URL)
	}
	res := quickRealEngine(t, "caddy_round_robin,caddy_least_conn",
		EngineOptions{Endpoints: endpoints, Arrivals: 2 * time.Second, Rates: []float64{8}})
	if len(res.Systems) != 2 {
		t.Fatalf("%d systems ran, want round robin and least_conn", len(res.Systems))
	}
	// A prompt's opening (one simulated KV block: 64 characters) tells
	// whose run it belongs to; the rest of its shared part is the prompt's.
	const opening = 64
	e, _ := EngineOptions{}.resolve(false, true)
	openings := map[string]map[string]bool{} // prefix id -> openings seen
	rest := map[string]string{}              // prefix id -> its shared words after the opening
	var ok int
	for _, s := range res.Systems {
		ok += s.OK
	}
	if len(rec.prompts) != ok {
		t.Fatalf("the replicas saw %d completions, the systems answered %d", len(rec.prompts), ok)
	}
	for _, p := range rec.prompts {
		if len(p.prompt) != 4*(e.PromptWords+e.UniqueWords) {
			t.Fatalf("prompt %s of %d characters, want %d words of 4", p.prefixID, len(p.prompt), e.PromptWords+e.UniqueWords)
		}
		shared := p.prompt[:4*e.PromptWords]
		if openings[p.prefixID] == nil {
			openings[p.prefixID] = map[string]bool{}
			rest[p.prefixID] = shared[opening:]
		}
		openings[p.prefixID][shared[:opening]] = true
		if shared[opening:] != rest[p.prefixID] {
			t.Errorf("prompt %s: its shared words after the opening differ between requests", p.prefixID)
		}
	}
	all := map[string]bool{}
	for id, o := range openings {
		if len(o) != len(res.Systems) {
			t.Errorf("prompt %s was sent with %d openings over %d systems' runs, want one per run", id, len(o), len(res.Systems))
		}
		for k := range o {
			if all[k] {
				t.Errorf("two prompts share the opening %q", strings.TrimSpace(k))
			}
			all[k] = true
		}
	}
}

// A replica that outlives a system's run may still be working on its
// requests when the run ends (those whose clients gave up: a server may
// notice only at their first token). The next system must start on an
// idle replica, not on that work: its first request reaches the replica
// only once nothing runs or waits there.
func TestNoSystemStartsOnTheWorkOfAnother(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	// Caddy built first: the work left must still run when the system starts.
	caddyForTests(context.Background(), t)
	s, err := sim.Start(engineReplicaConfig("kept", 0.1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	busy := func() float64 {
		m, err := scrapeMetrics(context.Background(), s.URL()+"/metrics")
		if err != nil {
			t.Errorf("the replica's metrics: %v", err)
			return -1
		}
		return m[runningGauge] + m[waitingGauge]
	}
	var atFirst sync.Mutex
	busyAtFirst := -1.0
	rec := &promptRecorder{first: func() {
		b := busy()
		atFirst.Lock()
		busyAtFirst = b
		atFirst.Unlock()
	}}
	front := rec.front(t, s.URL())
	// Work left by an earlier run: long requests sent straight to the
	// replica, still running as the next system starts.
	var left sync.WaitGroup
	for range 3 {
		left.Add(1)
		go func() {
			defer left.Done()
			body := `{"prompt":"kept kept kept","max_tokens":600,"stream":false,"ignore_eos":true}`
			resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Errorf("leftover request: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	defer left.Wait()
	for busy() < 3 {
		time.Sleep(20 * time.Millisecond)
	}
	res := quickRealEngine(t, "caddy_round_robin", EngineOptions{Endpoints: []string{front.URL}, Arrivals: time.Second, Rates: []float64{4}})
	if len(rec.prompts) == 0 {
		t.Fatal("the system sent nothing")
	}
	atFirst.Lock()
	defer atFirst.Unlock()
	if busyAtFirst != 0 {
		t.Fatalf("the system's first request reached the replica with %g requests of the run before running or waiting there", busyAtFirst)
	}
	var noted bool
	for _, n := range res.Systems[0].Notes {
		noted = noted || strings.Contains(n, "once the replicas were idle")
	}
	if !noted {
		t.Errorf("the system's notes do not say it waited for the replica: %q", res.Systems[0].Notes)
	}
}
