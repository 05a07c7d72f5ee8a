package docs

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/sluice-router/sluice"
	"github.com/sluice-router/sluice/sim"
)

// migrationGuides are the guides docs/migration/ must have: one per source
// system (../shared/seeds), each with a name table, the differences that
// change behaviour, and one complete Caddyfile, which the test adapts and
// runs.
var migrationGuides = map[string]func(t *testing.T, g *guideRun){
	"hf-custom-router.md": runHFGuide,
	"sglang-router.md":    runSGLangGuide,
	"gie-flow-control.md": runGIEGuide,
	"photoroom-redis.md":  runPhotoroomGuide,
	"heimdall.md":         runHeimdallGuide,
}

func TestMigrationGuides(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "docs", "migration")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	index, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".md") || name == "README.md" {
			continue
		}
		found[name] = true
		run, ok := migrationGuides[name]
		if !ok {
			t.Errorf("docs/migration/%s: a guide this test does not run; add it to migrationGuides", name)
			continue
		}
		if !strings.Contains(string(index), "("+name+")") {
			t.Errorf("docs/migration/README.md does not link %s", name)
		}
		t.Run(strings.TrimSuffix(name, ".md"), func(t *testing.T) {
			path := filepath.Join(dir, name)
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, section := range []string{"\n## Names\n", "\n## What behaves differently\n", "\n## A complete configuration\n"} {
				if !strings.Contains(string(text), section) {
					t.Errorf("%s: no %q section", name, strings.TrimSpace(section))
				}
			}
			if strings.Count(string(text), "\n| ") < 6 {
				t.Errorf("%s: the name table has fewer than 5 rows", name)
			}
			snips, err := extract(path, root)
			if err != nil {
				t.Fatal(err)
			}
			var complete []snippet
			for _, s := range snips {
				if isSiteOrGlobal(firstToken(s.text)) {
					complete = append(complete, s)
				}
			}
			if len(complete) != 1 {
				t.Fatalf("%s: %d complete Caddyfiles (starting with global options or a site), want exactly 1", name, len(complete))
			}
			s := complete[0]
			cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(s.text), map[string]any{"filename": s.file})
			if err != nil {
				t.Fatalf("%s:%d: the guide's Caddyfile does not adapt: %v", s.file, s.line, err)
			}
			if err := validateSluiceModules(cfg); err != nil {
				t.Fatalf("%s:%d: a Sluice module refuses the guide's Caddyfile: %v", s.file, s.line, err)
			}
			g := startGuide(t, s, cfg)
			run(t, g)
		})
	}
	for name := range migrationGuides {
		if !found[name] {
			t.Errorf("docs/migration/%s is missing", name)
		}
	}
}

// guideRun is a guide's configuration running in this process's Caddy,
// its listener moved to a free loopback port, every replica address it
// names replaced by a simulated replica.
type guideRun struct {
	url    string // the guide's site, e.g. http://127.0.0.1:41234
	sims   []*sim.Server
	cfg    map[string]any
	suffix string // added to every pool name
}

// isSluicePoolModule says whether a JSON object configures a Sluice module
// that names a pool.
func isSluicePoolModule(m map[string]any) bool {
	switch {
	case m["handler"] == "custom_router", m["handler"] == "flow_control", m["source"] == "custom_router":
		return true
	}
	switch m["policy"] {
	case "queued_least_latency", "cache_aware", "load_aware", "global_redis_least":
		return true
	}
	return false
}

// startGuide rewrites the adapted config for a test run and loads it. Runs
// that need more (Redis) call prepare first through the cfg they get back;
// so the load happens in load, below.
func startGuide(t *testing.T, s snippet, adapted []byte) *guideRun {
	t.Helper()
	t.Setenv("XDG_DATA_HOME", filepath.Join(t.TempDir(), "data"))
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(t.TempDir(), "config"))
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	g := &guideRun{cfg: cfg}
	for i := 0; i < 4; i++ {
		srv, err := sim.Start(sim.Config{Name: fmt.Sprintf("guide-sim-%d", i+1), Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		g.sims = append(g.sims, srv)
	}
	// No admin endpoint (ports are shared with other test binaries), no
	// autosave.
	cfg["admin"] = map[string]any{"disabled": true, "config": map[string]any{"persist": false}}
	cfg["storage"] = map[string]any{"module": "file_system", "root": t.TempDir()}
	cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}}
	servers, _ := dig(cfg, "apps", "http", "servers").(map[string]any)
	if len(servers) != 1 {
		t.Fatalf("%s:%d: %d servers, want the guide's one site", s.file, s.line, len(servers))
	}
	for _, v := range servers {
		srv := v.(map[string]any)
		port := freePort(t)
		srv["listen"] = []any{fmt.Sprintf("127.0.0.1:%d", port)}
		g.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	}
	// Replica addresses: static upstreams (one simulated replica per
	// address) and custom_router seeds.
	byDial := map[string]*sim.Server{}
	// Pools live as long as the process: give this run's pools names of
	// their own, so an earlier run's backend set (or one from another
	// guide) is not served here.
	g.suffix = fmt.Sprintf("-run%d", time.Now().UnixNano())
	walkJSON(cfg, func(m map[string]any) {
		if isSluicePoolModule(m) {
			pool, _ := m["pool"].(string)
			if pool == "" {
				pool = "default"
			}
			m["pool"] = pool + g.suffix
		}
		if d, ok := m["dial"].(string); ok && d != "" {
			if byDial[d] == nil {
				if len(byDial) == len(g.sims) {
					t.Fatalf("%s:%d: more upstreams than simulated replicas", s.file, s.line)
				}
				byDial[d] = g.sims[len(byDial)]
			}
			m["dial"] = byDial[d].Addr()
		}
		if m["handler"] == "custom_router" {
			if bs, ok := m["backends"].([]any); ok {
				for i := range bs {
					bs[i] = g.sims[i%len(g.sims)].URL()
				}
			}
		}
	})
	return g
}

// load runs the (rewritten) config and stops Caddy when the test ends.
func (g *guideRun) load(t *testing.T) {
	t.Helper()
	data, err := json.Marshal(g.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(data, true); err != nil {
		t.Fatalf("the guide's config does not load: %v", err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
}

var guideClient = &http.Client{Timeout: 30 * time.Second}

// call sends a request and returns its status, headers and body.
func (g *guideRun) call(t *testing.T, method, path, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := guideClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// mustCall is call expecting a status.
func (g *guideRun) mustCall(t *testing.T, want int, method, path, body string, header ...string) (http.Header, string) {
	t.Helper()
	status, h, b := g.call(t, method, path, body, header...)
	if status != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, status, b, want)
	}
	return h, b
}

// completion's prompt is longer than load_aware's hot_prefix_chars, so
// that a repeated one is hot (no_hit_lru then scores every replica alike).
const completion = `{"model": "sim-model", "prompt": "You are a helpful assistant for the docs test of Sluice's migration guides. Say hello.", "max_tokens": 4}`

func (g *guideRun) completionServed(t *testing.T, header ...string) http.Header {
	t.Helper()
	h, _ := g.mustCall(t, http.StatusOK, http.MethodPost, "/v1/completions", completion, header...)
	if !strings.HasPrefix(h.Get("X-Sim-Replica"), "guide-sim-") {
		t.Fatalf("the completion was not served by a simulated replica: headers %v", h)
	}
	return h
}

func runHFGuide(t *testing.T, g *guideRun) {
	g.load(t)
	// The platform's call, with the guide's token (its default).
	_, body := g.mustCall(t, http.StatusOK, http.MethodPost, "/_custom_router/set-backends",
		fmt.Sprintf(`{"backends": [%q, %q]}`, g.sims[0].URL(), g.sims[1].URL()), "Authorization", "Bearer change-me")
	if !strings.Contains(body, `"added"`) {
		t.Errorf("set-backends answer %s has no added list", body)
	}
	// Without the token: refused.
	g.mustCall(t, http.StatusUnauthorized, http.MethodPost, "/_custom_router/set-backends", `{"backends": []}`)
	_, body = g.mustCall(t, http.StatusOK, http.MethodGet, "/_custom_router/health", "")
	var h struct {
		Version  string `json:"version"`
		Backends []any  `json:"backends"`
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil || h.Version != sluice.Version || len(h.Backends) != 2 {
		t.Fatalf("health %s: version %q (want %q), %d backends (want 2), err %v", body, h.Version, sluice.Version, len(h.Backends), err)
	}
	g.completionServed(t)
	_, metrics := g.mustCall(t, http.StatusOK, http.MethodGet, "/_custom_router/metrics", "")
	if want := `custom_router_requests_dispatched_total{pool="default` + g.suffix + `"} 1`; !strings.Contains(metrics, want) {
		t.Errorf("metrics lack %s", want)
	}
}

func runSGLangGuide(t *testing.T, g *guideRun) {
	g.load(t)
	// --worker-urls seeded the pool (both seeds point at the first sims).
	_, body := g.mustCall(t, http.StatusOK, http.MethodGet, "/list_workers", "")
	if !strings.Contains(body, `"urls"`) {
		t.Fatalf("list_workers: %s", body)
	}
	// add_worker answers JSON with the new set (not SGLang's text).
	extra, err := sim.Start(sim.Config{Name: "guide-sim-added"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { extra.Close() })
	h, body := g.mustCall(t, http.StatusOK, http.MethodPost, "/add_worker?url="+extra.URL(), "")
	var added struct {
		OK   bool     `json:"ok"`
		URLs []string `json:"urls"`
	}
	if err := json.Unmarshal([]byte(body), &added); err != nil || !added.OK || !contains(added.URLs, extra.URL()) ||
		!strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		t.Fatalf("add_worker: %s (%v)", body, err)
	}
	// Removing a worker that is not in the set: 404 (SGLang answers 200).
	g.mustCall(t, http.StatusNotFound, http.MethodPost, "/remove_worker?url=http://127.0.0.1:9", "")
	g.mustCall(t, http.StatusOK, http.MethodPost, "/remove_worker?url="+extra.URL(), "")
	h, _ = g.mustCall(t, http.StatusOK, http.MethodPost, "/generate", `{"text": "What is the capital of France?"}`)
	if !strings.HasPrefix(h.Get("X-Sim-Replica"), "guide-sim-") {
		t.Fatalf("/generate not served by a seeded replica: %v", h)
	}
}

func runGIEGuide(t *testing.T, g *guideRun) {
	g.load(t)
	// From 127.0.0.1 (a trusted source), the objective maps to band 100.
	g.completionServed(t, "X-Gateway-Inference-Objective", "premium-traffic", "X-Gateway-Inference-Fairness-Id", "tenant-a")
	g.completionServed(t, "X-Gateway-Inference-Objective", "best-effort-traffic", "X-Gateway-Inference-Fairness-Id", "tenant-b")
	g.completionServed(t)
}

func runPhotoroomGuide(t *testing.T, g *guideRun) {
	addr := os.Getenv("SLUICE_TEST_REDIS_ADDR")
	if addr == "" {
		t.Skip("SLUICE_TEST_REDIS_ADDR is not set (scripts/test.sh sets it): the guide's config adapts and validates, but is not run")
	}
	walkJSON(g.cfg, func(m map[string]any) {
		if m["policy"] == "global_redis_least" {
			m["redis"] = []any{addr}
			m["key_prefix"] = fmt.Sprintf("docs-guide-%d", time.Now().UnixNano())
		}
	})
	g.load(t)
	g.mustCall(t, http.StatusOK, http.MethodPost, "/_custom_router/set-backends",
		fmt.Sprintf(`{"backends": [%q, %q]}`, g.sims[0].URL(), g.sims[1].URL()))
	g.completionServed(t)
}

func runHeimdallGuide(t *testing.T, g *guideRun) {
	g.load(t)
	h := g.completionServed(t)
	token := h.Get("X-Session-Token")
	if token == "" {
		t.Fatalf("no X-Session-Token on the response: %v", h)
	}
	// The token steers the next request of the session to the same replica.
	replica := h.Get("X-Sim-Replica")
	for i := 0; i < 3; i++ {
		if got := g.completionServed(t, "X-Session-Token", token).Get("X-Sim-Replica"); got != replica {
			t.Errorf("session request %d served by %s, want %s", i, got, replica)
		}
	}
}

func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func walkJSON(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys) // a stable order of replacements
		for _, k := range keys {
			walkJSON(x[k], fn)
		}
	case []any:
		for _, e := range x {
			walkJSON(e, fn)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
