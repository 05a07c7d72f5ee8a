package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// calFigures are one load's results, in engine seconds.
type calFigures struct {
	ttft50, ttft90, e2e50, e2e90 float64
	tokPerSec                    float64
	prefixShare                  float64
	answered, sent               int
	lag                          float64 // the steps' real time ÷ their modelled time
}

// The real engine's figures (shared/real-engine/2026-11-24-h100-transformers.md).
var calReal = map[float64]calFigures{
	4:  {ttft50: 0.49, ttft90: 1.65, e2e50: 4.79, e2e90: 6.11, tokPerSec: 94, prefixShare: 0.87, answered: 94, sent: 94},
	8:  {ttft50: 4.80, ttft90: 9.60, e2e50: 8.41, e2e90: 13.7, tokPerSec: 147, prefixShare: 0.89, answered: 206, sent: 206},
	12: {ttft50: 19.7, ttft90: 33.6, e2e50: 23.3, e2e90: 36.6, tokPerSec: 156, prefixShare: 0.90, answered: 308, sent: 320},
}

// calWords returns n random 3-letter words, each followed by a space, so
// that 4 characters are 1 token as the simulator counts them.
func calWords(rng *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		for range 3 {
			b.WriteByte(byte('a' + rng.IntN(26)))
		}
		b.WriteByte(' ')
	}
	return b.String()
}

// runCalibrationLoad drives one CalibratedEngine(scale) replica with the
// measured workload at rate req/s (engine time) for arrivals engine seconds,
// with the 40 s client timeout, and returns the figures in engine seconds.
//
// The n arrival times are drawn as a Poisson process conditioned on n
// arrivals (n sorted uniform times), so that a full run sends what the
// measured run sent.
func runCalibrationLoad(t *testing.T, cfg Config, scale, rate, arrivals float64, n int, seed uint64) calFigures {
	t.Helper()
	rp, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rp)
	tr := &http.Transport{MaxIdleConnsPerHost: 1024}
	client := &http.Client{Transport: tr}
	defer func() {
		srv.Close()
		_ = rp.Close()
		tr.CloseIdleConnections()
	}()

	rng := rand.New(rand.NewPCG(seed, seed+1))
	var system [4]string
	for i := range system {
		system[i] = calWords(rng, 1500)
	}
	type result struct {
		ttft, e2e time.Duration
		answered  bool
		end       time.Time
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	timeout := time.Duration(40 * scale * float64(time.Second))
	times := make([]float64, n) // engine seconds
	for i := range times {
		times[i] = rng.Float64() * arrivals
	}
	slices.Sort(times)
	start := time.Now().Add(-time.Duration(times[0] * scale * float64(time.Second))) // the first arrival is now
	for _, at := range times {
		body, _ := json.Marshal(map[string]any{
			"prompt":     system[rng.IntN(len(system))] + calWords(rng, 40),
			"max_tokens": 32,
			"stream":     true,
		})
		time.Sleep(time.Until(start.Add(time.Duration(at * scale * float64(time.Second)))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			res := result{}
			defer func() {
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
			}()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status %d", resp.StatusCode)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line := sc.Text()
				switch {
				case line == "data: [DONE]":
					res.e2e = time.Since(sent)
					res.end = time.Now()
					res.answered = true
					return
				case strings.HasPrefix(line, "data: ") && res.ttft == 0:
					res.ttft = time.Since(sent)
				}
			}
		}()
	}
	wg.Wait()

	var ttft, e2e []float64
	var last time.Time
	for _, r := range results {
		if !r.answered {
			continue
		}
		ttft = append(ttft, r.ttft.Seconds()/scale)
		e2e = append(e2e, r.e2e.Seconds()/scale)
		if r.end.After(last) {
			last = r.end
		}
	}
	st := rp.Stats()
	f := calFigures{
		ttft50: quantile(ttft, 0.5), ttft90: quantile(ttft, 0.9), e2e50: quantile(e2e, 0.5), e2e90: quantile(e2e, 0.9),
		prefixShare: st.HitRate(), answered: len(ttft), sent: len(results),
	}
	if len(ttft) > 0 {
		first := start.Add(time.Duration(times[0] * scale * float64(time.Second)))
		f.tokPerSec = float64(32*len(ttft)) / (last.Sub(first).Seconds() / scale)
	}
	if st.Busy > 0 {
		f.lag = st.StepWall.Seconds() / st.Busy.Seconds()
	}
	t.Logf("rate %v: steps %d, tokens/step %.1f, max batch %d, max waiting %d, max KV blocks %d/%d, steps' real time / modelled %.2f",
		rate, st.Steps, st.TokensPerStep(), st.MaxRunning, st.MaxWaiting, st.MaxKVBlocksUsed, st.KVBlocks, f.lag)
	return f
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// TestEngineCalibration checks CalibratedEngine against the measured
// engine. By default it runs a short workload and asserts the shape users
// depend on; SLUICE_CALIBRATE=1 (with -run Calibration -v) runs the full
// 25 s-equivalent workload and logs the table next to the real figures.
// SLUICE_CALIBRATE_SCALE sets the time scale (default 0.1).
func TestEngineCalibration(t *testing.T) {
	full := os.Getenv("SLUICE_CALIBRATE") != ""
	scale, arrivals := 0.1, 15.0 // 15 s: enough requests that the 4 cold prefixes leave the prefix share above 0.8
	if full {
		arrivals = 25
	}
	s := os.Getenv("SLUICE_CALIBRATE_SCALE")
	scaleSet := s != ""
	if scaleSet {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			t.Fatalf("SLUICE_CALIBRATE_SCALE %q: want a positive number", s)
		}
		scale = v
	}
	cfg := CalibratedEngine(scale)
	if s := os.Getenv("SLUICE_CALIBRATE_STEP"); s != "" {
		// "<step base>,<step per token>[,<step per context token>]" in
		// engine time, to try a refit.
		parts := strings.Split(s, ",")
		var ds []time.Duration
		for _, p := range parts {
			d, err := time.ParseDuration(p)
			if err != nil || d < 0 {
				ds = nil
				break
			}
			ds = append(ds, time.Duration(float64(d)*scale))
		}
		if len(ds) < 2 || len(ds) > 3 || len(ds) != len(parts) {
			t.Fatalf("SLUICE_CALIBRATE_STEP %q: want <duration>,<duration>[,<duration>]", s)
		}
		cfg.Latency.StepBase, cfg.Latency.StepPerToken = ds[0], ds[1]
		if len(ds) == 3 {
			cfg.Latency.StepPerContextToken = ds[2]
		}
	}
	if s := os.Getenv("SLUICE_CALIBRATE_ASYNC"); s != "" {
		v, err := strconv.ParseBool(s)
		if err != nil {
			t.Fatalf("SLUICE_CALIBRATE_ASYNC %q: want a boolean", s)
		}
		cfg.Latency.AsyncScheduling = v
	}
	if s := os.Getenv("SLUICE_CALIBRATE_SEQS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Concurrency = n
	}
	var got map[float64]calFigures
	for try := 0; ; try++ {
		got = map[float64]calFigures{}
		lag := 0.0
		for i, rate := range []float64{4, 8, 12} {
			n := int(rate * arrivals)
			if full {
				n = calReal[rate].sent
			}
			got[rate] = runCalibrationLoad(t, cfg, scale, rate, arrivals, n, uint64(i+1))
			lag = max(lag, got[rate].lag)
		}
		// A host too busy to keep the engine's clock (steps later than
		// modelled: -race, other packages' tests on 2 cores) measures
		// itself, not the model: at 1.3× the batch seemed to add no
		// throughput. Slower clocks make its lateness small beside a
		// step. Not when the scale was asked for.
		if lag <= maxCalibrationLag || full || scaleSet || try == 2 {
			if lag > maxCalibrationLag {
				t.Logf("the steps still ran %.2f× their modelled time at scale %v: the host is busy", lag, scale)
			}
			break
		}
		t.Logf("the steps ran %.2f× their modelled time at scale %v: again at scale %v", lag, scale, 2*scale)
		scale *= 2
		cfg = rescaled(cfg, 2)
	}

	ratio := func(a, b float64) float64 { return a / b }
	t.Logf("scale %v, %v s of arrivals (engine seconds); sim / real (ratio)", scale, arrivals)
	t.Logf("%-8s %-22s %-22s %-22s %-22s %-22s %-20s %s", "load", "TTFT p50", "TTFT p90", "e2e p50", "e2e p90", "tokens/s", "prefix share", "answered")
	for _, rate := range []float64{4, 8, 12} {
		g, r := got[rate], calReal[rate]
		t.Logf("%-8s %-22s %-22s %-22s %-22s %-22s %-20s %d/%d (real %d/%d)",
			strconv.FormatFloat(rate, 'f', -1, 64)+" req/s",
			cell(g.ttft50, r.ttft50, ratio), cell(g.ttft90, r.ttft90, ratio), cell(g.e2e50, r.e2e50, ratio), cell(g.e2e90, r.e2e90, ratio),
			cell(g.tokPerSec, r.tokPerSec, ratio), cell(g.prefixShare, r.prefixShare, ratio),
			g.answered, g.sent, r.answered, r.sent)
	}
	if full {
		return // the table is the result; the fit is judged by reading it
	}

	g4, g8, g12 := got[4], got[8], got[12]
	if !(g8.tokPerSec > 1.3*g4.tokPerSec) {
		t.Errorf("throughput at 8 req/s (%.0f tok/s) is not > 1.3 × that at 4 req/s (%.0f): the batch does not add throughput", g8.tokPerSec, g4.tokPerSec)
	}
	if !(g12.ttft50 > g4.ttft50) {
		t.Errorf("TTFT p50 at 12 req/s (%.2f s) is not above that at 4 req/s (%.2f s)", g12.ttft50, g4.ttft50)
	}
	cfg = CalibratedEngine(1)
	perToken := (g4.e2e50 - g4.ttft50) / 31
	// A lone request's decode step: one token over its 1,540-token prompt.
	l := cfg.Latency
	lone := (l.StepBase + l.StepPerToken + 1540*l.StepPerContextToken).Seconds()
	if !(perToken > lone) {
		t.Errorf("time per token after the first at 4 req/s (%.3f s) is not above a lone request's step (%.3f s): decodes do not slow with the batch", perToken, lone)
	}
	for _, rate := range []float64{4, 8, 12} {
		if s := got[rate].prefixShare; !(s >= 0.8) {
			t.Errorf("prefix share at %v req/s = %.2f, want ≥ 0.8", rate, s)
		}
	}
}

func cell(got, real float64, ratio func(a, b float64) float64) string {
	return strconv.FormatFloat(got, 'f', 2, 64) + " / " + strconv.FormatFloat(real, 'f', 2, 64) +
		" (" + strconv.FormatFloat(ratio(got, real), 'f', 2, 64) + ")"
}

// maxCalibrationLag: steps that ran longer than this times their
// modelled duration measured a busy host (quiet, the dev box ran them
// 1.04×; with eight busy loops beside -race, 1.26-1.48×, and the shape
// checks failed).
const maxCalibrationLag = 1.15

// rescaled is cfg with its engine's clock k times slower.
func rescaled(cfg Config, k float64) Config {
	l := &cfg.Latency
	for _, d := range []*time.Duration{&l.StepBase, &l.StepPerToken, &l.StepPerContextToken} {
		*d = time.Duration(float64(*d) * k)
	}
	return cfg
}
