package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// baseName is the stem of the output files.
func (r *Result) baseName() string {
	if r.Quick {
		return r.Scenario + r.suffix + ".quick"
	}
	return r.Scenario + r.suffix
}

func writeOutputs(r *Result, dir string) error {
	base := filepath.Join(dir, r.baseName())
	r.Files = []string{base + ".md", base + ".csv", base + ".json", base + ".svg"}
	if err := writeCSV(base+".csv", r.records); err != nil {
		return err
	}
	if err := os.WriteFile(base+".svg", []byte(cdfSVG(r)), 0o644); err != nil {
		return err
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".json", append(j, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(base+".md", []byte(markdown(r)), 0o644)
}

func writeCSV(path string, recs []Record) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write([]string{"system", "rep", "seq", "proxy", "start_s", "latency_s", "ttfb_s", "status", "replica", "class", "error", "ttft_s", "tokens"})
	sec := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	for _, r := range recs {
		w.Write([]string{r.System, strconv.Itoa(r.Rep), strconv.Itoa(r.Seq), strconv.Itoa(r.Proxy), sec(r.Start.Seconds()),
			sec(r.Latency.Seconds()), sec(r.TTFB.Seconds()), strconv.Itoa(r.Status), r.Replica, r.Class, r.Err,
			sec(r.TTFT.Seconds()), strconv.Itoa(r.Tokens)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tableRows returns the header and rows of the result table.
func tableRows(r *Result) ([]string, [][]string) {
	head := []string{"system", "proxies", "requests", "ok", "lost", "errors", "p50", "p90", "p99", "max", "ttfb p99", "throughput", "per replica min/max"}
	for _, e := range r.extras {
		head = append(head, e.Header)
	}
	ms := func(s float64) string {
		if s < 0.01 {
			return fmt.Sprintf("%.2f ms", s*1000)
		}
		if s < 1 {
			return fmt.Sprintf("%.0f ms", s*1000)
		}
		return fmt.Sprintf("%.2f s", s)
	}
	var rows [][]string
	for _, s := range r.Systems {
		row := []string{r.label(s), strconv.Itoa(s.Proxies), strconv.Itoa(s.Requests), strconv.Itoa(s.OK),
			strconv.Itoa(s.Lost), s.errorsString(), ms(s.P50), ms(s.P90), ms(s.P99), ms(s.Max), ms(s.TTFBP99),
			fmt.Sprintf("%.1f/s", s.Throughput), fmt.Sprintf("%d/%d", s.ReplicaMin, s.ReplicaMax)}
		for _, e := range r.extras {
			if v, ok := s.Extra[e.Key]; ok {
				row = append(row, fmt.Sprintf(e.Format, v))
			} else {
				row = append(row, "—")
			}
		}
		rows = append(rows, row)
	}
	return head, rows
}

// label names a system's row: with several reps, "system #rep".
func (r *Result) label(s Summary) string {
	if r.Reps > 1 {
		return fmt.Sprintf("%s #%d", s.System, s.Rep)
	}
	return s.System
}

// repRows returns, when the run had several reps, a table of each
// system's mean ± standard deviation over its reps: p50, p99, throughput
// and every scenario column; nil with one rep.
func repRows(r *Result) ([]string, [][]string) {
	if r.Reps < 2 {
		return nil, nil
	}
	head := []string{"system", "reps", "p50", "p99", "throughput"}
	for _, e := range r.extras {
		head = append(head, e.Header)
	}
	var order []string
	by := map[string][]Summary{}
	for _, s := range r.Systems {
		if _, ok := by[s.System]; !ok {
			order = append(order, s.System)
		}
		by[s.System] = append(by[s.System], s)
	}
	cell := func(vals []float64, format string) string {
		if len(vals) == 0 {
			return "—"
		}
		m, sd := meanSD(vals)
		return fmt.Sprintf(format, m) + " ± " + strings.TrimSpace(fmt.Sprintf(format, sd))
	}
	pick := func(ss []Summary, f func(Summary) (float64, bool)) []float64 {
		var out []float64
		for _, s := range ss {
			if v, ok := f(s); ok {
				out = append(out, v)
			}
		}
		return out
	}
	var rows [][]string
	for _, name := range order {
		ss := by[name]
		row := []string{name, strconv.Itoa(len(ss)),
			cell(pick(ss, func(s Summary) (float64, bool) { return s.P50, s.OK > 0 }), "%.3f s"),
			cell(pick(ss, func(s Summary) (float64, bool) { return s.P99, s.OK > 0 }), "%.3f s"),
			cell(pick(ss, func(s Summary) (float64, bool) { return s.Throughput, true }), "%.1f/s")}
		for _, e := range r.extras {
			row = append(row, cell(pick(ss, func(s Summary) (float64, bool) { v, ok := s.Extra[e.Key]; return v, ok }), e.Format))
		}
		rows = append(rows, row)
	}
	return head, rows
}

// meanSD returns the mean and the sample standard deviation (0 for one value).
func meanSD(v []float64) (float64, float64) {
	var sum float64
	for _, x := range v {
		sum += x
	}
	m := sum / float64(len(v))
	if len(v) < 2 {
		return m, 0
	}
	var ss float64
	for _, x := range v {
		ss += (x - m) * (x - m)
	}
	return m, math.Sqrt(ss / float64(len(v)-1))
}

// PrintTable writes the result table in aligned columns (and, with
// several reps, the table of means).
func PrintTable(w io.Writer, r *Result) {
	fmt.Fprintf(w, "\n%s\n", r.Title)
	head, rows := tableRows(r)
	printAligned(w, head, rows)
	if head, rows := repRows(r); head != nil {
		fmt.Fprintf(w, "\nmean ± sd over %d reps\n", r.Reps)
		printAligned(w, head, rows)
	}
	if r.appendix != "" {
		fmt.Fprintf(w, "\n%s", r.appendix)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "SKIPPED %s: %s\n", s.System, s.Reason)
	}
	p := r.Processes
	fmt.Fprintf(w, "processes: %d started, %d stopped (%d needed SIGKILL), %d exited on their own, %d not stopped\n",
		p.Started, p.Stopped, p.Killed, p.Early, p.Stuck)
	for _, f := range r.Failures {
		fmt.Fprintf(w, "FAILURE: %s\n", f)
	}
}

func printAligned(w io.Writer, head []string, rows [][]string) {
	width := make([]int, len(head))
	for _, row := range append([][]string{head}, rows...) {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(row []string) {
		for i, c := range row {
			pad := width[i] - len([]rune(c))
			if i == 0 {
				fmt.Fprint(w, c+strings.Repeat(" ", pad))
			} else {
				fmt.Fprint(w, "  "+strings.Repeat(" ", pad)+c)
			}
		}
		fmt.Fprintln(w)
	}
	line(head)
	for _, row := range rows {
		line(row)
	}
}

// mdTable writes a markdown table (first column left-aligned).
func mdTable(b *strings.Builder, head []string, rows [][]string) {
	b.WriteString("| " + strings.Join(head, " | ") + " |\n|")
	for i := range head {
		if i == 0 {
			b.WriteString("---|")
		} else {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, row := range rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
}

func markdown(r *Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", r.Title)
	fmt.Fprintf(&b, "Generated by `sluice-bench` on %s (%.0f s for the whole scenario).\n\n", r.Date, r.Elapsed)
	fmt.Fprintf(&b, "```sh\n%s\n```\n\n", r.Command)
	m := r.Machine
	fmt.Fprintf(&b, "Machine: %d CPUs (`nproc`), %s, %s, %s", m.NProc, m.CPU, m.Go, m.OS)
	if m.HAProxy != "" {
		fmt.Fprintf(&b, ", %s", m.HAProxy)
	}
	if m.Redis != "" {
		fmt.Fprintf(&b, ", %s", m.Redis)
	}
	b.WriteString(". Load generator, simulated replicas and every proxy on this one machine, over loopback.")
	if r.Quick {
		b.WriteString(" **Quick mode** (a smoke check: a few seconds per system, numbers are not meaningful).")
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "%s\n\n", r.About)
	head, rows := tableRows(r)
	mdTable(&b, head, rows)
	if head, rows := repRows(r); head != nil {
		fmt.Fprintf(&b, "\nMean ± sample standard deviation over the %d reps (reps run interleaved: rep 1 of every system, then rep 2…):\n\n", r.Reps)
		mdTable(&b, head, rows)
	}
	if r.appendix != "" {
		b.WriteString("\n" + r.appendix)
	}
	b.WriteString("\nLatency is client-side, to the last byte, over the requests answered 200 with a complete body; " +
		"`errors` are other answers by status; `lost` are requests without any answer (must be 0, but for a compared system's own known losses, named in the notes below). " +
		"Throughput counts OK answers per second from the first arrival to the last answer. " +
		"`per replica` is the spread of OK requests over the fleet's replicas (X-Sim-Replica).\n\n")
	b.WriteString("| system | what |\n|---|---|\n")
	for _, s := range r.Systems {
		if s.Rep <= 1 {
			fmt.Fprintf(&b, "| %s | %s |\n", s.System, s.Description)
		}
	}
	b.WriteString("\n")
	for _, s := range r.Systems {
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "- %s: %s\n", r.label(s), n)
		}
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(&b, "- **skipped** %s: %s\n", s.System, s.Reason)
	}
	p := r.Processes
	fmt.Fprintf(&b, "- processes: %d started, %d stopped (%d needed SIGKILL), %d exited on their own, %d not stopped\n",
		p.Started, p.Stopped, p.Killed, p.Early, p.Stuck)
	for _, f := range r.Failures {
		fmt.Fprintf(&b, "- **failure**: %s\n", f)
	}
	fmt.Fprintf(&b, "\n![latency CDF per system](%s.svg)\n\n", r.baseName())
	if r.Reps > 1 {
		b.WriteString("The plot shows rep 1 of each system.\n\n")
	}
	fmt.Fprintf(&b, "Files: per-request CSV `%[1]s.csv` (system, rep, seq, proxy, start_s, latency_s, ttfb_s, status, replica, class, error, ttft_s, tokens), "+
		"summary `%[1]s.json`, plot `%[1]s.svg`.\n", r.baseName())
	return b.String()
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"}

// cdfSVG plots each system's latency CDF (log-scale x) by hand.
func cdfSVG(r *Result) string {
	const W, H, left, right, top, bottom = 860.0, 480.0, 60.0, 260.0, 40.0, 50.0
	pw, ph := W-left-right, H-top-bottom
	lo, hi := math.Inf(1), math.Inf(-1)
	var systems []Summary
	for _, s := range r.Systems {
		if s.Rep <= 1 {
			systems = append(systems, s)
		}
	}
	for _, s := range systems {
		if len(s.latencies) > 0 {
			lo = math.Min(lo, s.latencies[0].Seconds())
			hi = math.Max(hi, s.latencies[len(s.latencies)-1].Seconds())
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 0.01, 1
	}
	x0 := math.Floor(math.Log10(math.Max(lo, 1e-4)))
	x1 := math.Ceil(math.Log10(math.Max(hi, 1e-4)))
	if x1 <= x0 {
		x1 = x0 + 1
	}
	xOf := func(sec float64) float64 {
		return left + (math.Log10(math.Max(sec, 1e-4))-x0)/(x1-x0)*pw
	}
	yOf := func(q float64) float64 { return top + (1-q)*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="14">%s — latency CDF (OK requests)</text>`+"\n", left, html.EscapeString(r.Scenario))
	// Grid: decades and 2, 5 within.
	for d := x0; d <= x1; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if math.Log10(v) > x1+1e-9 {
				break
			}
			x := xOf(v)
			stroke := "#eee"
			if m == 1 {
				stroke = "#ccc"
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x, top, x, top+ph, stroke)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#444">%s</text>`+"\n", x, top+ph+16, fmtSec(v))
		}
	}
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 0.9, 0.99, 1} {
		y := yOf(q)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, y, left+pw, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#444">%g</text>`+"\n", left-6, y+4, q)
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">latency (log scale)</text>`+"\n", left+pw/2, H-12)
	fmt.Fprintf(&b, `<text x="16" y="%.1f" transform="rotate(-90 16 %.1f)" text-anchor="middle">fraction of requests</text>`+"\n", top+ph/2, top+ph/2)
	for i, s := range systems {
		color := palette[i%len(palette)]
		n := len(s.latencies)
		if n > 0 {
			step := max(1, n/600)
			var pts []string
			for j := 0; j < n; j += step {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(s.latencies[j].Seconds()), yOf(float64(j+1)/float64(n))))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(s.latencies[n-1].Seconds()), yOf(1)))
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		}
		ly := top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", left+pw+14, ly, left+pw+34, ly, color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", left+pw+40, ly+4, html.EscapeString(s.System))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func fmtSec(v float64) string {
	if v < 1 {
		return strconv.FormatFloat(v*1000, 'f', -1, 64) + " ms"
	}
	return strconv.FormatFloat(v, 'f', -1, 64) + " s"
}
