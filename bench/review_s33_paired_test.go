package bench

import (
	"fmt"
	"strings"
	"testing"
)

func pairedRun(name string, rep int, ttft float64, requests, ok int) Summary {
	return Summary{System: name + "@9rps", Rep: rep, Requests: requests, OK: ok,
		Extra: map[string]float64{"rate": 9, "ttft_p50_s": ttft, "ttft_p90_s": ttft, "ttft_p99_s": ttft, "out_tok_s": 100}}
}

// The appendix says "mean of the per-rep differences ± standard error":
// the mean of the ratios (not the ratio of the means), the sample sd
// (n−1) over √n.
func TestReviewPairedIsTheMeanOfRatiosWithItsStandardError(t *testing.T) {
	// Ratios 1.10, 1.00, 0.96: mean +2.00%, sample sd 7.2111%, SE 4.16%.
	// The ratio of the means would be 3.58 / 3.5 − 1 = +2.29%.
	app := pairedRatios([]Summary{
		pairedRun("caddy_round_robin", 1, 1.0, 10, 10), pairedRun("sluice_x", 1, 1.1, 10, 10),
		pairedRun("caddy_round_robin", 2, 2.0, 10, 10), pairedRun("sluice_x", 2, 2.0, 10, 10),
		pairedRun("caddy_round_robin", 3, 0.5, 10, 10), pairedRun("sluice_x", 3, 0.48, 10, 10),
	})
	if !strings.Contains(app, "| 9/s | sluice_x | 3 | +2.00% ± 4.16% |") {
		t.Fatalf("appendix:\n%s", app)
	}
}

// TTFT is over the OK answers only: a system whose requests time out
// shows the TTFT of those that made it. The appendix must say how many
// did not, next to round robin's, or a system failing requests reads
// faster than one serving them all.
func TestReviewPairedShowsTheRequestsLeftOut(t *testing.T) {
	app := pairedRatios([]Summary{
		pairedRun("caddy_round_robin", 1, 1.0, 100, 100), pairedRun("sluice_fails", 1, 0.8, 100, 70),
		pairedRun("caddy_round_robin", 2, 1.0, 100, 99), pairedRun("sluice_fails", 2, 0.8, 100, 60),
		pairedRun("sluice_fails", 3, 0.8, 100, 0), // no round robin in rep 3: no pair
	})
	want := fmt.Sprintf("| 9/s | sluice_fails | 2 | %s | %s | %s | +0.00%% ± 0.00%% | 70 / 1 |", "-20.00% ± 0.00%", "-20.00% ± 0.00%", "-20.00% ± 0.00%")
	if !strings.Contains(app, want) || !strings.Contains(app, "| not ok |") {
		t.Fatalf("appendix lacks %q (and a \"not ok\" column):\n%s", want, app)
	}
}
