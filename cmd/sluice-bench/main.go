// Command sluice-bench runs one load-test scenario of package bench:
// simulated replicas in process, the systems under test (Sluice, Caddy's
// built-in policies, HAProxy) as separate processes on loopback, open-loop
// load, and a report (table, CSV, JSON, SVG, markdown).
//
//	go run ./cmd/sluice-bench <scenario> [-quick] [-out bench/results] [-caddy path] [-only substr] [-reps N]
//
// It exits non-zero when a request got no answer, a process crashed or
// could not be stopped, or a system failed to run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-router/sluice/bench"
)

func main() {
	fs := flag.NewFlagSet("sluice-bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "smoke mode: a few seconds per system (for CI)")
	out := fs.String("out", "bench/results", "output directory")
	caddyBin := fs.String("caddy", "", "prebuilt Sluice Caddy binary (default: $SLUICE_CADDY_BIN, else go build ./cmd/caddy)")
	reps := fs.Int("reps", 1, "run every system this many times, interleaved, and report mean ± sd")
	only := fs.String("only", "", "run only the systems whose name contains one of these comma-separated substrings")
	noInstall := fs.Bool("no-install", false, "do not apt-get install missing haproxy / redis-server")
	limit := fs.Duration("timeout", 0, "abort the scenario after this long (default 5m, 90s with -quick; chaos: 20m; real-engine: 15m on the sim, 30m (4m with -quick) with -engine llmd, 3h on real engines; kv-events: 15m, 4m with -quick)")
	// real-engine and engine-calibration
	var eng bench.EngineOptions
	engine := fs.String("engine", "", "real-engine: replicas from \"sim\" (default, in process), \"transformers\" (bench/realengine/server.py, needs PyTorch) or \"llmd\" (llm-d-inference-sim: SLUICE_LLMD_SIM or scripts/llmd-sim.sh)")
	endpoints := fs.String("endpoints", "", "real-engine: your own OpenAI-compatible replicas, comma-separated http://host:port (vLLM, SGLang, TGI)")
	fs.StringVar(&eng.Model, "model", "", "real-engine: the requests' model (default: the first of the first replica's /v1/models; none with the sim)")
	fs.IntVar(&eng.Replicas, "replicas", 0, "real-engine: R, replicas for sim / transformers / llmd (default 4; llmd: 1)")
	rate := fs.Float64("rate", 0, "real-engine: arrival rate, req/s of engine time (default 4; llmd: 20 and 30)")
	rates := fs.String("rates", "", "real-engine: several arrival rates, comma-separated (e.g. 4,8,12)")
	fs.Float64Var(&eng.Scale, "scale", 0, "real-engine: time scale, 1 s of engine time runs in SCALE s (default 0.25 with the sim, else 1)")
	fs.Float64Var(&eng.SharedGPU, "shared-gpu", 0, "real-engine -engine sim: the R engines share one simulated GPU, as R replicas on one GPU do; the value is the share of a step's fixed cost that is GPU work (0 < F <= 1; default 0: a GPU each)")
	fs.StringVar(&eng.StreamHeaders, "stream-headers", "", "real-engine -engine sim: when the engines send a stream's headers: immediate (default: at once, before the queue and the prefill, as vLLM and SGLang do) or first_token (with the first token, to compare)")
	fs.IntVar(&eng.Prompts, "prompts", 0, "real-engine: P, shared system prompts (default 4)")
	fs.IntVar(&eng.PromptWords, "prompt-words", 0, "real-engine: W, words (= tokens) per system prompt (default 1500)")
	fs.IntVar(&eng.UniqueWords, "unique-words", 0, "real-engine: U, unique words per request (default 40)")
	fs.IntVar(&eng.MaxTokens, "max-tokens", 0, "real-engine: max_tokens of every request (default 32; llmd: 16)")
	fs.DurationVar(&eng.Arrivals, "arrivals", 0, "real-engine: how long arrivals last, engine time (default 25s; 8s with -quick)")
	fs.DurationVar(&eng.ClientTimeout, "client-timeout", 0, "real-engine: client timeout per request, engine time (default 40s)")
	fs.StringVar(&eng.Python, "python", "", "real-engine -engine transformers: the Python interpreter (default python3)")
	serverArgs := fs.String("server-args", "", "real-engine -engine transformers / llmd: extra flags for server.py (e.g. \"--layers 2 --hidden 256 --device cpu\") or llm-d-inference-sim (after the scenario's own: the last wins), space-separated")
	overheadReq := fs.String("overhead-request", "", "overhead, overhead-interleaved: what each request is: tiny (default: a 1-token completion, 2000 req/s), chat1k (streamed chat, 1 KB system prompt, 16 tokens, 800 req/s) or chat4k (4 KB, 64 tokens, 320 req/s); the files get -chat1k / -chat4k")
	calibrate := fs.Bool("calibrate", false, "real-engine: run the engine-calibration scenario instead (direct to ONE replica at 4, 8, 12 req/s)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: go run ./cmd/sluice-bench <scenario> [flags]\n\nscenarios:\n")
		for _, s := range bench.Scenarios() {
			fmt.Fprintf(os.Stderr, "  %-14s %s\n", s, bench.ScenarioAbout(s))
		}
		fmt.Fprintf(os.Stderr, "\nflags:\n")
		fs.PrintDefaults()
	}
	// Flags may come before or after the scenario name.
	args := os.Args[1:]
	var scenario string
	var rest []string
	for _, a := range args {
		if scenario == "" && !strings.HasPrefix(a, "-") && (len(rest) == 0 || !needsValue(rest[len(rest)-1])) {
			scenario = a
			continue
		}
		rest = append(rest, a)
	}
	if err := fs.Parse(rest); err != nil {
		os.Exit(2)
	}
	if scenario == "" && fs.NArg() > 0 {
		scenario = fs.Arg(0)
	}
	if scenario == "" {
		fs.Usage()
		os.Exit(2)
	}
	eng.Engine = *engine
	for _, ep := range strings.Split(*endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			eng.Endpoints = append(eng.Endpoints, ep)
		}
	}
	if *rate > 0 {
		eng.Rates = []float64{*rate}
	}
	for _, v := range strings.Split(*rates, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sluice-bench: -rates: %q is not a number\n", v)
			os.Exit(2)
		}
		eng.Rates = append(eng.Rates, f)
	}
	eng.ServerArgs = strings.Fields(*serverArgs)
	if *calibrate && scenario == "real-engine" {
		scenario = "engine-calibration"
	}
	d := *limit
	if d == 0 {
		d = 5 * time.Minute
		if *quick {
			d = 90 * time.Second
		}
		if !*quick && scenario == "chaos" {
			// Eight systems of 10,000 requests each, with Redis outages:
			// 321 s on a 2-core machine (bench/results/chaos.md).
			d = 20 * time.Minute
		}
		if scenario == "kv-events" {
			// Ten systems, each with four llm-d-inference-sim engines: 40 s
			// of arrivals + start and drain each (4 s with -quick).
			d = 15 * time.Minute
			if *quick {
				d = 4 * time.Minute
			}
		}
		if !*quick && (scenario == "real-engine" || scenario == "engine-calibration") {
			// Real engines run in real time: 25 s + the drain per system and rate.
			d = 15 * time.Minute
			if eng.Engine == "llmd" {
				// 9 systems × 2 rates, each 25 s + a drain of up to 12 s.
				d = 30 * time.Minute
			}
			if eng.Engine == "transformers" || len(eng.Endpoints) > 0 {
				d = 3 * time.Hour
			}
		}
		if *quick && eng.Engine == "llmd" && scenario == "real-engine" {
			// 9 systems of 8 s each, every one with its own engine.
			d = 4 * time.Minute
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()

	res, err := bench.Run(ctx, bench.Options{
		Scenario: scenario, Quick: *quick, OutDir: *out, CaddyBin: *caddyBin, Only: *only, NoInstall: *noInstall, Reps: *reps,
		Engine: eng, OverheadRequest: *overheadReq,
		Command: "go run ./cmd/sluice-bench " + strings.Join(args, " "),
	})
	if res != nil {
		bench.PrintTable(os.Stdout, res)
		fmt.Printf("wrote %s\n", strings.Join(res.Files, ", "))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench:", err)
		os.Exit(1)
	}
	if err := res.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-bench: not clean:", err)
		os.Exit(1)
	}
}

func needsValue(flagArg string) bool {
	name := strings.TrimLeft(flagArg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	switch name {
	case "out", "caddy", "only", "timeout", "reps", "engine", "endpoints", "model", "replicas", "rate", "rates", "scale",
		"prompts", "prompt-words", "unique-words", "max-tokens", "arrivals", "client-timeout", "python", "server-args", "shared-gpu":
		return true
	}
	return false
}
