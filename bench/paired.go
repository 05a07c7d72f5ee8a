package bench

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// pairedBase is the system every other one is paired with, per rep and
// rate, in pairedRatios.
const pairedBase = "caddy_round_robin"

// pairedRatios is the appendix of a multi-replica run of several reps:
// every system's TTFT p50 / p90 / p99 and output tokens/s against round
// robin's in the same rep and at the same rate (the same workload, run
// minutes apart at most), as the mean of the per-rep differences with
// its standard error. Means of each system's quantiles over the reps
// (the table above) hide a 1% difference in a spread of 5% between
// reps' workloads; paired, each rep's workload cancels out and what is
// left is the method's own spread (caddy_round_robin_again's row: round
// robin against itself).
func pairedRatios(systems []Summary) string {
	base := runsOf(systems, pairedBase)
	cols := []struct{ key, head string }{
		{"ttft_p50_s", "ttft p50"}, {"ttft_p90_s", "ttft p90"}, {"ttft_p99_s", "ttft p99"}, {"out_tok_s", "out tok/s"},
	}
	type group struct {
		system string
		rate   float64
		diffs  [][]float64 // per column: (system ÷ base − 1) per rep
		// notOK, baseNotOK: the requests without a complete 200 answer
		// in the reps run with round robin, which TTFT (over the OK
		// ones) leaves out: a system failing requests must not read
		// faster unseen.
		notOK, baseNotOK int
	}
	var order []*group
	groups := map[string]*group{}
	for _, s := range systems {
		b, ok := base[runOf(s)]
		if !ok || s.System == b.System {
			continue
		}
		g := groups[s.System]
		if g == nil {
			g = &group{system: s.System, rate: s.Extra["rate"], diffs: make([][]float64, len(cols))}
			groups[s.System] = g
			order = append(order, g)
		}
		g.notOK += s.Requests - s.OK
		g.baseNotOK += b.Requests - b.OK
		for i, c := range cols {
			v, vok := s.Extra[c.key]
			w, wok := b.Extra[c.key]
			if vok && wok && w > 0 && s.OK > 0 && b.OK > 0 {
				g.diffs[i] = append(g.diffs[i], v/w-1)
			}
		}
	}
	if len(order) == 0 {
		return ""
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].rate < order[j].rate })
	head := []string{"rate", "system", "pairs"}
	for _, c := range cols {
		head = append(head, c.head)
	}
	head = append(head, "not ok")
	var rows [][]string
	for _, g := range order {
		row := []string{fmt.Sprintf("%g/s", g.rate), strings.Split(g.system, "@")[0], strconv.Itoa(len(g.diffs[0]))}
		for _, d := range g.diffs {
			row = append(row, pairedCell(d))
		}
		row = append(row, fmt.Sprintf("%d / %d", g.notOK, g.baseNotOK))
		rows = append(rows, row)
	}
	var b strings.Builder
	b.WriteString("Paired with Caddy round_robin, rep by rep (same workload, same rate): each figure's difference " +
		"from round robin's, mean ± standard error over the pairs (a difference under two standard errors is not " +
		"told apart from none; `caddy_round_robin_again` is round robin against itself, the method's own error). " +
		"TTFT: lower is better; out tok/s: higher is better. TTFT is over the requests answered 200 in full; " +
		"`not ok` counts the others (timeouts, errors) in the reps run with round robin, the system's / round robin's.\n\n")
	mdTable(&b, head, rows)
	return b.String()
}

// pairedCell is "+1.23% ± 0.45%": the mean of d (fractions) and its
// standard error; "—" without pairs, no ± with one.
func pairedCell(d []float64) string {
	if len(d) == 0 {
		return "—"
	}
	m, sd := meanSD(d)
	if len(d) < 2 {
		return fmt.Sprintf("%+.2f%%", 100*m)
	}
	return fmt.Sprintf("%+.2f%% ± %.2f%%", 100*m, 100*sd/math.Sqrt(float64(len(d))))
}

// repRate names one run of a system in a multi-rate, multi-rep scenario.
type repRate struct {
	rep  int
	rate float64
}

func runOf(s Summary) repRate { return repRate{s.Rep, s.Extra["rate"]} }

// runsOf indexes the runs of the system named name (before its "@rate").
func runsOf(systems []Summary, name string) map[repRate]Summary {
	runs := map[repRate]Summary{}
	for _, s := range systems {
		if strings.Split(s.System, "@")[0] == name {
			runs[runOf(s)] = s
		}
	}
	return runs
}
