// Package bench is Sluice's load-test harness: on one machine, over
// loopback only, it starts a fleet of simulated replicas (package sim, in
// process), starts the systems under test as separate processes (the Sluice
// Caddy binary with each policy, Caddy's built-in policies through the same
// binary, HAProxy), drives open-loop load, records every request and writes
// a table, per-request CSV, a JSON summary, an SVG latency CDF and a
// markdown report. cmd/sluice-bench is its command line; README.md in this
// directory explains the scenarios and how to read the results.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// Options configure one run of a scenario.
type Options struct {
	Scenario string
	// Quick runs a few seconds per system (CI smoke check).
	Quick bool
	// OutDir receives <scenario>[.quick].{md,csv,json,svg}.
	OutDir string
	// CaddyBin is a prebuilt Sluice Caddy binary; empty: $SLUICE_CADDY_BIN,
	// else built once into a temp dir.
	CaddyBin string
	// NoInstall disables installing missing haproxy / redis-server with
	// apt-get (attempted only as root).
	NoInstall bool
	// Only, if not empty, runs only the systems whose name contains one
	// of its comma-separated substrings.
	Only string
	// Reps runs every system this many times (default 1), interleaved:
	// rep 1 of every system, then rep 2… The report adds mean ± sd.
	Reps int
	// OverheadRequest is what the overhead scenarios send: tiny (""),
	// chat1k or chat4k (overhead_request.go); ignored by the others.
	OverheadRequest string
	// Engine configures the real-engine and engine-calibration scenarios
	// (ignored by the others).
	Engine EngineOptions
	// Command is the command line shown in the report.
	Command string
	// Log receives progress (default os.Stderr).
	Log io.Writer
}

// Skip is a system that could not run, and why.
type Skip struct {
	System string `json:"system"`
	Reason string `json:"reason"`
}

// Machine describes where the run happened.
type Machine struct {
	NProc   int    `json:"nproc"`
	CPU     string `json:"cpu"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	HAProxy string `json:"haproxy,omitempty"`
	Redis   string `json:"redis,omitempty"`
}

// Result is a scenario's outcome.
type Result struct {
	Scenario  string    `json:"scenario"`
	Title     string    `json:"title"`
	About     string    `json:"about"`
	Quick     bool      `json:"quick"`
	Reps      int       `json:"reps"`
	Command   string    `json:"command"`
	Date      string    `json:"date"`
	Elapsed   float64   `json:"elapsed_s"`
	Machine   Machine   `json:"machine"`
	Systems   []Summary `json:"systems"`
	Skipped   []Skip    `json:"skipped,omitempty"`
	Processes procStats `json:"processes"`
	// Failures are the reasons the run is not clean (lost requests,
	// processes that crashed or did not stop, systems that failed).
	Failures []string `json:"failures,omitempty"`
	Files    []string `json:"files"`

	extras  []extraCol
	records []Record
	// suffix is added to the output files' stem (a scenario's variant).
	suffix string
	// appendix is markdown the scenario adds after the table (also printed).
	appendix string
}

// extraCol is a scenario-specific column of the table.
type extraCol struct {
	Key, Header, Format string
}

// Err returns an error when the run is not clean: a request without an
// answer, a process that exited on its own or did not stop, a system
// that could not run for another reason than a missing tool.
func (r *Result) Err() error {
	if len(r.Failures) == 0 {
		return nil
	}
	return errors.New(strings.Join(r.Failures, "; "))
}

// Scenarios lists the scenario names in order.
func Scenarios() []string {
	names := make([]string, 0, len(scenarios))
	for _, s := range scenarios {
		names = append(names, s.name)
	}
	return names
}

// ScenarioAbout returns a scenario's one-line description.
func ScenarioAbout(name string) string {
	for _, s := range scenarios {
		if s.name == name {
			return s.title
		}
	}
	return ""
}

type scenario struct {
	name, title, about string
	extras             []extraCol
	run                func(r *runner)
}

// runner holds what one scenario run shares between its systems.
type runner struct {
	ctx      context.Context
	opt      Options
	log      io.Writer
	tmp      string
	caddyBin string
	haproxy  string // path; empty when unavailable (haproxyWhy says why)
	why      map[string]string
	redis    string // address of the private redis-server, started lazily
	infra    *procs // redis: lives for the whole scenario
	procs    *procs // the current system's processes
	res      *Result
	seq      int
	rep      int // 1-based repetition now running
	// engines are the base URLs of replicas that live for the whole
	// scenario (the real-engine scenario's external or Python replicas).
	engines []string
}

// Run runs one scenario and writes its outputs. The returned Result is
// non-nil whenever outputs were written; check Result.Err for a clean run.
func Run(ctx context.Context, opt Options) (*Result, error) {
	var sc *scenario
	for i := range scenarios {
		if scenarios[i].name == opt.Scenario {
			sc = &scenarios[i]
		}
	}
	if sc == nil {
		return nil, fmt.Errorf("unknown scenario %q (have: %s)", opt.Scenario, strings.Join(Scenarios(), ", "))
	}
	if _, err := overheadRequestOf(opt.OverheadRequest); err != nil {
		return nil, err
	}
	if opt.Log == nil {
		opt.Log = os.Stderr
	}
	if opt.OutDir == "" {
		opt.OutDir = filepath.Join("bench", "results")
	}
	if err := os.MkdirAll(opt.OutDir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	began := time.Now()
	r := &runner{ctx: ctx, opt: opt, log: opt.Log, tmp: tmp, why: map[string]string{},
		infra: &procs{dir: tmp}, procs: &procs{dir: tmp},
		res: &Result{Scenario: sc.name, Title: sc.title, About: sc.about, Quick: opt.Quick, Reps: max(opt.Reps, 1),
			Command: opt.Command, Date: began.UTC().Format(time.RFC3339), extras: sc.extras}}
	if r.caddyBin, err = caddyBinary(ctx, opt, tmp, r.log); err != nil {
		return nil, err
	}
	r.haproxy = r.tool("haproxy", "haproxy")
	r.res.Machine = machine(r.haproxy)

	func() {
		defer r.infra.stopAll(3 * time.Second)
		defer r.procs.stopAll(3 * time.Second) // after a panic or cancel
		for r.rep = 1; r.rep <= max(opt.Reps, 1) && ctx.Err() == nil; r.rep++ {
			if opt.Reps > 1 {
				fmt.Fprintf(r.log, "=== %s: rep %d of %d\n", sc.name, r.rep, opt.Reps)
			}
			sc.run(r)
		}
	}()

	ps := r.procs.snapshot()
	is := r.infra.snapshot()
	r.res.Processes = procStats{Started: ps.Started + is.Started, Stopped: ps.Stopped + is.Stopped,
		Killed: ps.Killed + is.Killed, Early: ps.Early + is.Early, Stuck: ps.Stuck + is.Stuck}
	if p := r.res.Processes; p.Early > 0 || p.Stuck > 0 {
		r.res.Failures = append(r.res.Failures, fmt.Sprintf("processes: %d exited on their own, %d did not stop", p.Early, p.Stuck))
	}
	if ctx.Err() != nil {
		r.res.Failures = append(r.res.Failures, "run cancelled: "+ctx.Err().Error())
	}
	r.res.Elapsed = time.Since(began).Seconds()
	if err := writeOutputs(r.res, opt.OutDir); err != nil {
		return r.res, err
	}
	return r.res, nil
}

// caddyBinary returns the Caddy binary to run: opt.CaddyBin,
// $SLUICE_CADDY_BIN, or one built now into tmp.
func caddyBinary(ctx context.Context, opt Options, tmp string, log io.Writer) (string, error) {
	if opt.CaddyBin != "" {
		return opt.CaddyBin, nil
	}
	if b := os.Getenv("SLUICE_CADDY_BIN"); b != "" {
		return b, nil
	}
	return BuildCaddy(ctx, tmp, log)
}

// BuildCaddy builds the Sluice Caddy binary into dir (at most 5 minutes).
func BuildCaddy(ctx context.Context, dir string, log io.Writer) (string, error) {
	bin := filepath.Join(dir, "caddy")
	fmt.Fprintf(log, "building %s (go build ./cmd/caddy)…\n", bin)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/sluice-router/sluice/cmd/caddy")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building caddy: %w", err)
	}
	return bin, nil
}

// tool finds an executable, installing its Debian package with apt-get
// when missing and running as root (unless NoInstall). It returns "" and
// records why when it is unavailable.
func (r *runner) tool(name, pkg string) string {
	look := func() string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, d := range []string{"/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"} {
			if st, err := os.Stat(filepath.Join(d, name)); err == nil && !st.IsDir() {
				return filepath.Join(d, name)
			}
		}
		return ""
	}
	if p := look(); p != "" {
		return p
	}
	if r.opt.NoInstall || os.Geteuid() != 0 {
		r.why[name] = fmt.Sprintf("%s not found (install the Debian package %q: apt-get install -y %s)", name, pkg, pkg)
		return ""
	}
	fmt.Fprintf(r.log, "%s not found: apt-get install -y %s …\n", name, pkg)
	ctx, cancel := context.WithTimeout(r.ctx, 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", pkg)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	out, err := cmd.CombinedOutput()
	if err != nil {
		// The package lists may be missing: update once and retry.
		upd := exec.CommandContext(ctx, "apt-get", "update")
		_ = upd.Run()
		cmd = exec.CommandContext(ctx, "apt-get", "install", "-y", pkg)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err = cmd.CombinedOutput()
	}
	if p := look(); p != "" {
		return p
	}
	r.why[name] = fmt.Sprintf("%s not found and apt-get install -y %s failed: %v %s", name, pkg, err, lastLine(string(out)))
	return ""
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// redisAddr starts the scenario's private redis-server on first use.
func (r *runner) redisAddr() (string, error) {
	if r.redis != "" {
		return r.redis, nil
	}
	if addr := r.why["redis-server"]; addr != "" {
		return "", errors.New(addr)
	}
	bin := r.tool("redis-server", "redis-server")
	if bin == "" {
		return "", errors.New(r.why["redis-server"])
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(r.tmp, "redis")
	os.MkdirAll(dir, 0o755)
	p, err := r.infra.start("redis-server", nil, bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "yes")
	if err != nil {
		return "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitListening(r.ctx, p, addr, 10*time.Second); err != nil {
		r.why["redis-server"] = err.Error()
		return "", err
	}
	out, _ := exec.Command(bin, "--version").Output()
	r.res.Machine.Redis = strings.TrimSpace(string(out))
	r.redis = addr
	fmt.Fprintf(r.log, "redis-server pid %d on %s\n", p.cmd.Process.Pid, addr)
	return addr, nil
}

// startCaddy runs one Sluice Caddy instance with its own Caddyfile, data
// and config dirs; site is the body of the ":port" site block. admin is
// "off" or a host:port. It returns the proxy's base URL once it listens.
func (r *runner) startCaddy(name string, port int, admin, site string) (string, error) {
	r.seq++
	dir := filepath.Join(r.tmp, fmt.Sprintf("%02d-%s", r.seq, name))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cf, []byte(caddyfile(port, admin, site)), 0o644); err != nil {
		return "", err
	}
	env := []string{"XDG_DATA_HOME=" + filepath.Join(dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(dir, "config")}
	p, err := r.procs.start(fmt.Sprintf("%02d-%s", r.seq, name), env, r.caddyBin, "run", "--config", cf, "--adapter", "caddyfile")
	if err != nil {
		return "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitListening(r.ctx, p, addr, 20*time.Second); err != nil {
		return "", err
	}
	return "http://" + addr, nil
}

func caddyfile(port int, admin, site string) string {
	return fmt.Sprintf(`{
	admin %s
	persist_config off
	auto_https off
	grace_period %v
	log {
		level WARN
	}
}

:%d {
	bind 127.0.0.1
	%s
}
`, admin, caddyGracePeriod, port, strings.ReplaceAll(strings.TrimSpace(site), "\n", "\n\t"))
}

// caddyGracePeriod is how long a Caddy the harness reloads lets the old
// config's requests finish.
const caddyGracePeriod = 2 * time.Second

// startHAProxy runs one HAProxy (foreground, -db) in front of servers.
// serverMaxconn > 0 sets maxconn on every server, so HAProxy queues
// requests itself (its central queue); 0 leaves them unlimited.
// startHAProxy starts one HAProxy, balance leastconn over servers (each
// with maxconn serverMaxconn if > 0); frontendRules are extra lines of its
// frontend section (e.g. http-request set-priority-class).
func (r *runner) startHAProxy(name string, port int, servers []string, serverMaxconn int, frontendRules ...string) (string, error) {
	if r.haproxy == "" {
		return "", fmt.Errorf("%w: %s", errSkipped, r.why["haproxy"])
	}
	r.seq++
	dir := filepath.Join(r.tmp, fmt.Sprintf("%02d-%s", r.seq, name))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `global
	maxconn 4000

defaults
	mode http
	timeout connect 5s
	timeout client 120s
	timeout server 120s
	timeout queue 120s
	option http-keep-alive

frontend fe
	bind 127.0.0.1:%d
%s	default_backend be

backend be
	balance leastconn
`, port, indentLines(frontendRules))
	for i, s := range servers {
		fmt.Fprintf(&b, "\tserver s%d %s", i, s)
		if serverMaxconn > 0 {
			fmt.Fprintf(&b, " maxconn %d", serverMaxconn)
		}
		b.WriteString("\n")
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	p, err := r.procs.start(fmt.Sprintf("%02d-%s", r.seq, name), nil, r.haproxy, "-db", "-f", cfg)
	if err != nil {
		return "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitListening(r.ctx, p, addr, 10*time.Second); err != nil {
		return "", err
	}
	return "http://" + addr, nil
}

// indentLines renders config lines, one tab in, each ending in a newline.
func indentLines(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("\t" + l + "\n")
	}
	return b.String()
}

// sysSpec is one system of a scenario.
type sysSpec struct {
	name, desc string
	proxies    int
	// fleet are the replicas, started fresh for this system.
	fleet []sim.Config
	// start starts the proxies (given the fleet's addresses) and returns
	// their base URLs. Return an error wrapping errSkipped to skip.
	start func(fleet []*sim.Server) ([]string, error)
	// load is the workload against the proxies.
	load func(fleet []*sim.Server, proxies []string) workload
	// after adds scenario measures (sims' stats, action times) to s; it
	// gets every record, keep or not.
	after func(fleet []*sim.Server, recs []Record, s *Summary)
	// timeout bounds each request.
	reqTimeout time.Duration
	// timeScale, if > 0, is the scenario's time scale: every record's
	// times are divided by it before the summary (figures in engine time).
	timeScale float64
	// keep, if set, selects the records the system's summary is made of
	// (the others are the load of a reference proxy run alongside it,
	// e.g. overhead's round_robin twin); lost requests count from all.
	keep func(Record) bool
	// abandoned, if set, names the requests their client gave up on
	// purpose (chaos's cancels): no answer to one of those is not a loss.
	abandoned func(Record) bool
	// lossExplained, if set, says why a lost request is the compared
	// system's own known behaviour (Caddy's reload racing a kept-alive
	// connection, reloadRaceLoss): it stays counted in lost and is named
	// in the summary's notes, but is no failure of the run. Only for a
	// system Sluice is compared against, never for a Sluice one.
	lossExplained func(Record) (why string, ok bool)
}

// system runs one system end to end: fleet, proxies, load, stop.
func (r *runner) system(spec sysSpec) {
	if r.ctx.Err() != nil {
		return
	}
	if !selected(spec.name, r.opt.Only) {
		return
	}
	fmt.Fprintf(r.log, "== %s: %s\n", r.res.Scenario, spec.name)
	fail := func(err error) {
		if errors.Is(err, errSkipped) {
			msg := strings.TrimPrefix(err.Error(), errSkipped.Error()+": ")
			fmt.Fprintf(r.log, "   SKIPPED %s: %s\n", spec.name, msg)
			r.res.Skipped = append(r.res.Skipped, Skip{spec.name, msg})
			return
		}
		fmt.Fprintf(r.log, "   FAILED %s: %v\n", spec.name, err)
		r.res.Failures = append(r.res.Failures, fmt.Sprintf("%s: %v", spec.name, err))
	}
	var fleet []*sim.Server
	defer func() {
		r.procs.stopAll(3 * time.Second)
		for _, s := range fleet {
			s.Close()
		}
	}()
	var names []string
	for _, c := range spec.fleet {
		s, err := sim.Start(c)
		if err != nil {
			fail(err)
			return
		}
		fleet = append(fleet, s)
		names = append(names, c.Name)
	}
	proxies, err := spec.start(fleet)
	if err != nil {
		fail(err)
		return
	}
	w := spec.load(fleet, proxies)
	timeout := spec.reqTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	recs, actErrs := drive(r.ctx, spec.name, w, timeout)
	if err := r.procs.alive(); err != nil {
		fail(err)
	}
	for i := range recs {
		recs[i].Rep = r.rep
		if k := spec.timeScale; k > 0 && k != 1 {
			rec := &recs[i]
			for _, d := range []*time.Duration{&rec.Start, &rec.Latency, &rec.TTFB, &rec.TTFT, &rec.LastToken} {
				*d = time.Duration(float64(*d) / k)
			}
		}
	}
	all := recs
	if spec.keep != nil {
		var kept []Record
		for _, rec := range recs {
			if spec.keep(rec) {
				kept = append(kept, rec)
			}
		}
		recs = kept
	}
	lostOne := func(rec Record) bool { return rec.Lost() && (spec.abandoned == nil || !spec.abandoned(rec)) }
	sum := summarize(spec.name, spec.desc, spec.proxies, names, recs)
	sum.Rep = r.rep
	if spec.abandoned != nil { // summarize counted every request without an answer
		sum.Lost = 0
		for _, rec := range recs {
			if lostOne(rec) {
				sum.Lost++
			}
		}
	}
	for _, e := range actErrs {
		sum.Notes = append(sum.Notes, "action failed: "+e.Error())
		r.res.Failures = append(r.res.Failures, fmt.Sprintf("%s: action failed: %v", spec.name, e))
	}
	if spec.after != nil {
		spec.after(fleet, all, &sum)
	}
	// The system's lost requests, plus the reference proxy's when only
	// part of the records were kept, less those the system's own known
	// behaviour explains (noted instead).
	lost := 0
	var first *Record
	explained := map[string]int{}
	var whys []string
	for i, rec := range all {
		if !lostOne(rec) {
			continue
		}
		if spec.lossExplained != nil {
			if why, ok := spec.lossExplained(rec); ok {
				if explained[why] == 0 {
					whys = append(whys, why)
				}
				explained[why]++
				continue
			}
		}
		lost++
		if first == nil {
			first = &all[i]
		}
	}
	for _, why := range whys {
		note := fmt.Sprintf("%d lost: %s (the compared system's own behaviour, not a failure of the run)", explained[why], why)
		sum.Notes = append(sum.Notes, note)
		fmt.Fprintf(r.log, "   %s\n", note)
	}
	if lost > 0 {
		r.res.Failures = append(r.res.Failures, fmt.Sprintf("%s: %d requests lost (no answer)", spec.name, lost))
		fmt.Fprintf(r.log, "   lost: seq %d (proxy %d, started %v, after %v): %s\n", first.Seq, first.Proxy, first.Start, first.Latency, first.Err)
	}
	r.res.Systems = append(r.res.Systems, sum)
	r.res.records = append(r.res.records, recs...)
	fmt.Fprintf(r.log, "   %d requests, %d ok, %d lost, errors %s, p50 %.3fs p99 %.3fs\n",
		sum.Requests, sum.OK, sum.Lost, sum.errorsString(), sum.P50, sum.P99)
}

// selected reports whether a system named name runs under -only.
func selected(name, only string) bool {
	if only == "" {
		return true
	}
	for _, sub := range strings.Split(only, ",") {
		if sub = strings.TrimSpace(sub); sub != "" && strings.Contains(name, sub) {
			return true
		}
	}
	return false
}

// post sends a small request (admin or control API) and checks for 2xx.
func post(ctx context.Context, url, ctype, body string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}

func machine(haproxy string) Machine {
	m := Machine{NProc: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if haproxy != "" {
		if out, err := exec.Command(haproxy, "-v").Output(); err == nil {
			m.HAProxy = lastLineFirst(string(out))
		}
	}
	return m
}

func lastLineFirst(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
