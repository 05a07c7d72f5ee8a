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
	limit := fs.Duration("timeout", 0, "abort the scenario after this long (default 5m, 90s with -quick)")
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
	d := *limit
	if d == 0 {
		d = 5 * time.Minute
		if *quick {
			d = 90 * time.Second
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()

	res, err := bench.Run(ctx, bench.Options{
		Scenario: scenario, Quick: *quick, OutDir: *out, CaddyBin: *caddyBin, Only: *only, NoInstall: *noInstall, Reps: *reps,
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
	case "out", "caddy", "only", "timeout", "reps":
		return true
	}
	return false
}
