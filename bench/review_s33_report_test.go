package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A system that answered nothing (every request lost or refused, or none
// sent) still gets a report: files written, no NaN or Inf in any of them,
// "—" where there is nothing to average.
func TestReviewReportOfSystemsWithoutAnswers(t *testing.T) {
	none := func(rep int) Summary {
		s := summarize("sluice_x@9rps", "", 1, []string{"a"}, nil)
		s.Rep = rep
		return s
	}
	refused := func(rep int) Summary {
		s := summarize("caddy_round_robin@9rps", "", 1, []string{"a"}, []Record{{Status: 503}, {Status: 0, Err: "lost"}})
		s.Rep = rep
		return s
	}
	r := &Result{Scenario: "review", Title: "review", Reps: 2,
		extras:  []extraCol{{"ttft_p50_s", "ttft p50", "%.2f s"}},
		Systems: []Summary{refused(1), none(1), refused(2), none(2)}}
	r.appendix = pairedRatios(r.Systems)
	dir := t.TempDir()
	if err := writeOutputs(r, dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"NaN", "Inf"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s holds %s:\n%s", filepath.Base(f), bad, b)
			}
		}
	}
	md := markdown(r)
	for _, w := range []string{
		"| caddy_round_robin@9rps #1 | 1 | 2 | 0 | 1 | 503×1 |",
		"| sluice_x@9rps | 2 | — | — | 0.0/s ± 0.0/s | — |",
	} {
		if !strings.Contains(md, w) {
			t.Errorf("report lacks %q:\n%s", w, md)
		}
	}
}
