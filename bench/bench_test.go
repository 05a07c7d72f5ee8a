package bench

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestQuickLocalView runs the local-view scenario in quick mode end to end:
// 16 simulated replicas, 23 proxy processes (Caddy, HAProxy) and a private
// Redis, over loopback. It checks that every request got an answer, every
// process was stopped, and the CSV/JSON/SVG/markdown outputs exist. No
// timing assertion. With SLUICE_CADDY_BIN set it uses that binary, else it
// builds the Sluice Caddy once into a temp dir.
//
// HAProxy and redis-server are needed: when they are missing (and cannot
// be installed: root only), the test fails under CI=true and is skipped
// otherwise.
func TestQuickLocalView(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	for _, tool := range []struct{ bin, pkg string }{{"haproxy", "haproxy"}, {"redis-server", "redis-server"}} {
		if !haveTool(t, tool.bin, tool.pkg) {
			msg := tool.bin + " is missing and could not be installed (apt-get install -y " + tool.pkg + ", as root)"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	tmp := t.TempDir()
	bin := caddyForTests(ctx, t)
	out := filepath.Join(tmp, "out")
	res, err := Run(ctx, Options{Scenario: "local-view", Quick: true, OutDir: out, CaddyBin: bin,
		NoInstall: true, Command: "go test ./bench/", Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Errorf("run not clean: %v", err)
	}
	if len(res.Skipped) > 0 {
		t.Errorf("systems skipped: %+v", res.Skipped)
	}
	ran := map[string]bool{}
	for _, s := range res.Systems {
		ran[s.System] = true
	}
	for _, want := range []string{"caddy_least_conn_x4", "haproxy_leastconn_x4", "sluice_global_redis_least_x4",
		"sluice_global_redis_queue_x4", "central_haproxy_maxconn1", "central_sluice_qll_1ms"} {
		if !ran[want] {
			t.Errorf("system %s did not run (ran: %v)", want, ran)
		}
	}
	p := res.Processes
	if p.Started == 0 || p.Stopped != p.Started || p.Early != 0 || p.Stuck != 0 {
		t.Errorf("processes: %+v", p)
	}

	// The JSON summary: lost == 0 everywhere, every request answered 200.
	var sum struct {
		Systems []struct {
			System   string `json:"system"`
			Requests int    `json:"requests"`
			OK       int    `json:"ok"`
			Lost     int    `json:"lost"`
		} `json:"systems"`
	}
	readJSON(t, filepath.Join(out, "local-view.quick.json"), &sum)
	total := 0
	for _, s := range sum.Systems {
		if s.Lost != 0 || s.Requests == 0 {
			t.Errorf("%s: %d requests, %d lost", s.System, s.Requests, s.Lost)
		}
		total += s.Requests
	}

	// The CSV: one row per request, each with a status.
	f, err := os.Open(filepath.Join(out, "local-view.quick.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows)-1 != total {
		t.Errorf("CSV has %d rows, JSON counts %d requests", len(rows)-1, total)
	}
	for _, row := range rows[1:] {
		if row[6] == "0" {
			t.Errorf("lost request in CSV: %v", row)
			break
		}
	}
	for _, ext := range []string{".md", ".svg"} {
		b, err := os.ReadFile(filepath.Join(out, "local-view.quick"+ext))
		if err != nil || len(b) == 0 {
			t.Errorf("missing %s output: %v", ext, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(out, "local-view.quick.md"))
	if !strings.Contains(string(md), "central_sluice_qll_1ms") {
		t.Errorf("markdown lacks the table:\n%s", md)
	}
}

func haveTool(t *testing.T, bin, pkg string) bool {
	r := &runner{ctx: context.Background(), opt: Options{NoInstall: os.Getenv("CI") != "true"}, log: testLog{t}, why: map[string]string{}}
	return r.tool(bin, pkg) != ""
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestQuantileAndSummary(t *testing.T) {
	recs := []Record{
		{Status: 200, Latency: 100 * time.Millisecond, Replica: "a"},
		{Status: 200, Latency: 300 * time.Millisecond, Replica: "a"},
		{Status: 503, Latency: time.Millisecond},
		{Status: 0, Err: "refused"},
	}
	s := summarize("x", "", 1, []string{"a", "b"}, recs)
	if s.OK != 2 || s.Lost != 1 || s.Errors["503"] != 1 {
		t.Fatalf("%+v", s)
	}
	if s.P50 != 0.1 || s.Max != 0.3 || s.ReplicaMin != 0 || s.ReplicaMax != 2 {
		t.Fatalf("%+v", s)
	}
	if _, err := exec.LookPath("sleep"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no sleep(1): the process-manager test needs it")
		}
		t.Skip("no sleep(1)")
	}
	m := &procs{dir: t.TempDir()}
	if _, err := m.start("sleep", nil, "sleep", "30"); err != nil {
		t.Fatal(err)
	}
	m.stopAll(2 * time.Second)
	if st := m.snapshot(); st.Stopped != 1 || st.Stuck != 0 || st.Early != 0 {
		t.Fatalf("%+v", st)
	}
}

var (
	caddyOnce sync.Once
	caddyBin  string
	caddyErr  error
	caddyDir  string // the shared build's directory, removed by TestMain
)

// TestMain removes the Caddy the tests built (~95 MB in the system's
// temporary directory, left behind by every run before).
func TestMain(m *testing.M) {
	code := m.Run()
	if caddyDir != "" {
		os.RemoveAll(caddyDir)
	}
	os.Exit(code)
}

// caddyForTests is the Sluice Caddy binary the harness tests run:
// SLUICE_CADDY_BIN, or one build shared by the tests of this package.
func caddyForTests(ctx context.Context, t *testing.T) string {
	if bin := os.Getenv("SLUICE_CADDY_BIN"); bin != "" {
		return bin
	}
	caddyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-bench-caddy-")
		if err != nil {
			caddyErr = err
			return
		}
		caddyDir = dir
		caddyBin, caddyErr = BuildCaddy(ctx, dir, testLog{t})
	})
	if caddyErr != nil {
		t.Fatal(caddyErr)
	}
	return caddyBin
}

// needProcessesAndRedis skips a test that starts processes under -short,
// and one that needs redis-server where there is none (fails under CI).
func needProcessesAndRedis(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes; skipped with -short")
	}
	if !haveTool(t, "redis-server", "redis-server") {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is missing and could not be installed")
		}
		t.Skip("redis-server is missing")
	}
}

// The chaos scenario in quick mode: every Sluice policy under cancels,
// replica kills, set-backends churn, hot reloads (good and refused) and
// Redis outages ends with nothing lost, nothing leaked, no panic.
func TestQuickChaos(t *testing.T) {
	needProcessesAndRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	bin := caddyForTests(ctx, t)
	res, err := Run(ctx, Options{Scenario: "chaos", Quick: true, OutDir: filepath.Join(t.TempDir(), "out"), CaddyBin: bin,
		NoInstall: true, Command: "go test ./bench/", Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Errorf("chaos run not clean: %v", err)
	}
	if len(res.Systems) != 8 {
		t.Errorf("%d systems ran, want 8", len(res.Systems))
	}
	for _, s := range res.Systems {
		if s.Requests < 1000 || s.Lost != 0 || s.Extra["leaked"] != 0 || s.Extra["panics"] != 0 {
			t.Errorf("%s: requests %d, lost %d, leaked %v, panics %v", s.System, s.Requests, s.Lost, s.Extra["leaked"], s.Extra["panics"])
		}
		if s.Extra["cancelled"] == 0 {
			t.Errorf("%s: no client gave up: the scenario did not test cancellation", s.System)
		}
	}
}

// multi-instance-flow in quick mode, its x2 systems only (about 10 s): two
// Caddy processes with flow_control sharing the count through a private
// Redis and two without, tenant A alone first. It checks a clean run and
// that the replica-side measures are there; no timing assertion.
func TestQuickMultiInstanceFlow(t *testing.T) {
	needProcessesAndRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	bin := caddyForTests(ctx, t)
	res, err := Run(ctx, Options{Scenario: "multi-instance-flow", Quick: true, OutDir: filepath.Join(t.TempDir(), "out"),
		CaddyBin: bin, NoInstall: true, Only: "sluice_flow_redis_x2,sluice_flow_local_x2", Command: "go test ./bench/", Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Errorf("run not clean: %v", err)
	}
	ran := map[string]Summary{}
	for _, s := range res.Systems {
		ran[s.System] = s
	}
	for _, want := range []string{"A_alone_sluice_flow_redis_x2", "sluice_flow_redis_x2", "sluice_flow_local_x2"} {
		s, ok := ran[want]
		if !ok {
			t.Errorf("system %s did not run (ran: %v, skipped: %v)", want, ran, res.Skipped)
			continue
		}
		if s.Proxies != 2 || s.Lost != 0 || s.Extra["A_ok"] == 0 {
			t.Errorf("%s: proxies %d, lost %d, A ok %v", want, s.Proxies, s.Lost, s.Extra["A_ok"])
		}
		if s.Extra["max_replica_inflight"] < 1 || s.Extra["max_pool_inflight"] < 1 || s.Extra["A_vs_alone"] == 0 {
			t.Errorf("%s: replica-side measures missing: %v", want, s.Extra)
		}
	}
}
