package bench

import (
	"fmt"
	"strings"
	"testing"
)

// The paired appendix compares each system with round robin in the same
// rep and at the same rate only, and gives the mean difference with its
// standard error.
func TestPairedRatios(t *testing.T) {
	sum := func(name string, rep int, rate, ttft, tok float64) Summary {
		return Summary{System: fmt.Sprintf("%s@%grps", name, rate), Rep: rep, Requests: 10, OK: 10,
			Extra: map[string]float64{"rate": rate, "ttft_p50_s": ttft, "ttft_p90_s": 2 * ttft, "ttft_p99_s": 3 * ttft, "out_tok_s": tok}}
	}
	failed := sum("sluice_c", 2, 16, 0.1, 100)
	failed.OK = 0
	app := pairedRatios([]Summary{
		sum("caddy_round_robin", 1, 16, 0.40, 100), sum("sluice_a", 1, 16, 0.42, 100), sum("sluice_c", 1, 16, 0.40, 110),
		sum("caddy_round_robin", 2, 16, 0.50, 100), sum("sluice_a", 2, 16, 0.49, 102), failed,
		// Another rate pairs with its own round robin; a rep without one
		// pairs with nothing.
		sum("caddy_round_robin", 1, 8, 0.30, 50), sum("sluice_a", 1, 8, 0.33, 50),
		sum("sluice_a", 3, 16, 9, 1),
	})
	for _, w := range []string{
		"| 16/s | sluice_a | 2 | +1.50% ± 3.50% | +1.50% ± 3.50% | +1.50% ± 3.50% | +1.00% ± 1.00% |",
		"| 16/s | sluice_c | 1 | +0.00% | +0.00% | +0.00% | +10.00% |",
		"| 8/s | sluice_a | 1 | +10.00% | +10.00% | +10.00% | +0.00% |",
	} {
		if !strings.Contains(app, w) {
			t.Errorf("appendix lacks %q:\n%s", w, app)
		}
	}
	if strings.Contains(app, "| caddy_round_robin |") {
		t.Errorf("round robin paired with itself:\n%s", app)
	}
	if i, j := strings.Index(app, "| 8/s |"), strings.Index(app, "| 16/s |"); i < 0 || j < 0 || i > j {
		t.Errorf("rates not in order:\n%s", app)
	}
	if pairedRatios([]Summary{sum("sluice_a", 1, 16, 0.4, 1)}) != "" {
		t.Error("an appendix without round robin")
	}
}
