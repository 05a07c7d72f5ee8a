package loadaware

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func fresh(addr string, waiting float64) Candidate {
	return Candidate{Addr: addr, Waiting: waiting, MetricsFresh: true}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func check(t *testing.T, name string, got, want []float64) {
	t.Helper()
	for i := range want {
		if !near(got[i], want[i]) {
			t.Fatalf("%s: got %v, want %v", name, got, want)
		}
	}
}

func TestQueueScorer(t *testing.T) {
	out := make([]float64, 4)
	scoreQueue([]Candidate{fresh("a", 0), fresh("b", 5), fresh("c", 10), {Addr: "dead"}}, out)
	check(t, "spread", out, []float64{1, 0.5, 0, 0})
	scoreQueue([]Candidate{fresh("a", 3), fresh("b", 3), fresh("c", 3), {Addr: "dead"}}, out)
	check(t, "all equal", out, []float64{1, 1, 1, 0})
}

func TestLoadAwareScorerLighterIsHigher(t *testing.T) {
	out := make([]float64, 5)
	scoreLoadAware([]Candidate{fresh("a", 0), fresh("b", 64), fresh("c", 128), fresh("d", 500), {Addr: "stale", Waiting: 0}}, 128, out)
	check(t, "edges", out, []float64{0.5, 0.25, 0, 0, 0})
}

func TestActiveRequestScorer(t *testing.T) {
	out := make([]float64, 3)
	scoreActive([]Candidate{{Active: 0}, {Active: 2}, {Active: 4}}, out)
	check(t, "spread", out, []float64{1, 0.5, 0})
	scoreActive([]Candidate{{}, {}, {}}, out)
	check(t, "all idle", out, []float64{1, 1, 1})
}

func TestActiveTokensScorer(t *testing.T) {
	out := make([]float64, 3)
	// Same request counts, different sizes: the one holding the long
	// generation scores lowest.
	scoreActiveTokens([]Candidate{{Active: 2, ActiveTokens: 8000}, {Active: 2, ActiveTokens: 200}, {Active: 0}}, out)
	check(t, "spread", out, []float64{0, 0.975, 1})
	scoreActiveTokens([]Candidate{{}, {}, {}}, out)
	check(t, "all idle", out, []float64{1, 1, 1})
}

func TestSessionAffinityScorer(t *testing.T) {
	out := make([]float64, 2)
	cs := []Candidate{{Addr: "a"}, {Addr: "b"}}
	scoreSession(cs, RequestFacts{SessionAddr: "b"}, out)
	check(t, "known", out, []float64{0, 1})
	scoreSession(cs, RequestFacts{}, out)
	check(t, "none", out, []float64{0, 0})
}

func TestNoHitLRUScorer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cs := []Candidate{{Addr: "recent", LastCold: t0.Add(2 * time.Second)}, {Addr: "older", LastCold: t0}, {Addr: "never"}}
	out := make([]float64, 3)
	scoreNoHitLRU(cs, RequestFacts{}, out)
	check(t, "cold", out, []float64{0, 0.5, 1})
	scoreNoHitLRU(cs, RequestFacts{Hot: true}, out)
	check(t, "hot", out, []float64{0.5, 0.5, 0.5})
}

func TestKVCacheScorer(t *testing.T) {
	out := make([]float64, 3)
	scoreKVCache([]Candidate{{MetricsFresh: true, KVCacheUsage: 0.25}, {MetricsFresh: true, KVCacheUsage: 1.5}, {KVCacheUsage: 0}}, out)
	check(t, "kv", out, []float64{0.75, 0, 0})
}

func TestRankWeightsAndFallbackOrder(t *testing.T) {
	p := New(Config{Weights: map[string]float64{ActiveRequest: 1, SessionAffinity: 3}, MaxNumEndpoints: 3})
	cs := []Candidate{{Addr: "a", Active: 0}, {Addr: "b", Active: 4}, {Addr: "c", Active: 2}}
	r := p.Rank(cs, RequestFacts{SessionAddr: "b"})
	// b: 3×1 + 0 = 3; a: 1; c: 0.5
	if fmt.Sprint(r.Order) != "[1 0 2]" || !near(r.Total[1], 3) || !near(r.Scores[ActiveRequest][2], 0.5) {
		t.Fatalf("order %v totals %v", r.Order, r.Total)
	}
	r = p.Rank(cs, RequestFacts{})
	if fmt.Sprint(r.Order) != "[0 2 1]" {
		t.Fatalf("without a session: order %v, want least active first", r.Order)
	}
}

func TestRankBreaksTiesAtRandom(t *testing.T) {
	p := New(Config{Weights: map[string]float64{ActiveRequest: 1}})
	cs := []Candidate{{Addr: "a"}, {Addr: "b"}, {Addr: "c"}}
	seen := map[int]int{}
	for i := 0; i < 300; i++ {
		seen[p.Rank(cs, RequestFacts{}).Order[0]]++
	}
	if len(seen) != 3 {
		t.Fatalf("ties always went to %v", seen)
	}
}

func TestStaleMetricsNeverMakeAReplicaLookIdle(t *testing.T) {
	p := New(Config{Weights: map[string]float64{Queue: 1, LoadAware: 1, KVCache: 1}})
	cs := []Candidate{{Addr: "dead"}, fresh("busy", 20)}
	cs[1].KVCacheUsage = 0.9
	if r := p.Rank(cs, RequestFacts{}); r.Order[0] != 1 {
		t.Fatalf("a replica with unknown metrics won: totals %v", r.Total)
	}
}

func TestNoteColdIsBoundedByLRUSize(t *testing.T) {
	p := New(Config{LRUSize: 2})
	t0 := time.Unix(0, 0)
	p.NoteCold("a", t0)
	p.NoteCold("b", t0.Add(time.Second))
	p.NoteCold("c", t0.Add(2*time.Second))
	if !p.LastCold("a").IsZero() || p.LastCold("c").IsZero() {
		t.Fatal("the oldest entry must be evicted beyond lru_size")
	}
	p.Forget(map[string]bool{"c": true})
	if !p.LastCold("b").IsZero() {
		t.Fatal("Forget must drop removed replicas")
	}
}

func TestAdaptiveShiftsWeightUnderSLOPressureAndBack(t *testing.T) {
	p := New(Config{Weights: map[string]float64{ActiveRequest: 1, SessionAffinity: 1}, SLO: 100 * time.Millisecond, AdaptiveStep: 0.25})
	for i := 0; i < 8; i++ {
		p.ObserveTTFT(time.Second)
	}
	w := p.Weights()
	if p.Shift() != 1 || w[ActiveRequest] != 2 || w[SessionAffinity] != 0 {
		t.Fatalf("under pressure: shift %v weights %v", p.Shift(), w)
	}
	// Under full shift, load wins over the session's replica.
	cs := []Candidate{{Addr: "a", Active: 5}, {Addr: "b", Active: 0}}
	if r := p.Rank(cs, RequestFacts{SessionAddr: "a"}); r.Order[0] != 1 {
		t.Fatalf("adaptive mode should prefer the idle replica: %v", r.Total)
	}
	for i := 0; i < 40; i++ {
		p.ObserveTTFT(10 * time.Millisecond)
	}
	if p.Shift() != 0 {
		t.Fatalf("after recovery: shift %v", p.Shift())
	}
}

func TestConfigValidateNamesTheField(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Weights: map[string]float64{"bogus": 1}}, "bogus"},
		{Config{Weights: map[string]float64{Queue: -1}}, "queue"},
		{Config{Weights: map[string]float64{Queue: 0}}, "at least one scorer"},
		{Config{Threshold: 0.5}, "threshold"},
		{Config{LRUSize: -1}, "lru_size"},
		{Config{MaxNumEndpoints: -2}, "max_num_endpoints"},
		{Config{AdaptiveStep: 2}, "adaptive_step"},
	} {
		err := c.cfg.WithDefaults().Validate()
		if err == nil || !contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want it to mention %q", c.cfg, err, c.want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func BenchmarkRank64AllScorers(b *testing.B) {
	w := map[string]float64{}
	for _, s := range AllScorers {
		w[s] = 1
	}
	p := New(Config{Weights: w, MaxNumEndpoints: 2})
	cs := make([]Candidate, 64)
	t0 := time.Now()
	for i := range cs {
		cs[i] = Candidate{Addr: fmt.Sprintf("10.0.0.%d:8000", i), Waiting: float64(i % 7), KVCacheUsage: float64(i%10) / 10,
			MetricsFresh: true, Active: i % 5, ActiveTokens: int64(i%5) * 700, LastCold: t0.Add(time.Duration(i) * time.Millisecond)}
	}
	f := RequestFacts{SessionAddr: cs[7].Addr}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.Rank(cs, f)
	}
}

func TestUnknownMetricsScoreNeutralNotWorstNorBest(t *testing.T) {
	p := New(Config{Weights: map[string]float64{Queue: 1, LoadAware: 1}})
	cs := []Candidate{fresh("read-first", 0), {Addr: "not-yet-read", MetricsUnknown: true}, {Addr: "stale"}}
	r := p.Rank(cs, RequestFacts{})
	if r.Total[1] != r.Total[0] {
		t.Fatalf("a replica not read yet must tie with the fresh idle one, not lose to it: %v", r.Total)
	}
	if r.Total[2] != 0 {
		t.Fatalf("a stale replica must score the worst: %v", r.Total)
	}
}

// enabled lists the scorers with a weight above 0.
func enabled(w map[string]float64) []string {
	var out []string
	for _, s := range AllScorers {
		if w[s] > 0 {
			out = append(out, s)
		}
	}
	return out
}

func TestDefaultScorersAreInFlightCountAndTokens(t *testing.T) {
	cfg := Config{}.WithDefaults()
	if got := fmt.Sprint(enabled(cfg.Weights)); got != fmt.Sprint([]string{ActiveRequest, ActiveTokens}) {
		t.Fatalf("default scorers %v, want active_request + active_tokens", got)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// What the set is for: a replica busy with one long generation ranks
	// below one busy with a short chat, and an idle one above both,
	// whatever the (lagging) scraped queue lengths say.
	p := New(Config{MaxNumEndpoints: 3})
	cs := []Candidate{
		{Addr: "long", Active: 1, ActiveTokens: 5000, MetricsFresh: true},
		{Addr: "idle", Active: 0, ActiveTokens: 0, MetricsFresh: true, Waiting: 50},
		{Addr: "short", Active: 1, ActiveTokens: 60, MetricsFresh: true},
	}
	for range 20 {
		if got := p.Rank(cs, RequestFacts{}).Order; fmt.Sprint(got) != "[1 2 0]" {
			t.Fatalf("order %v, want idle, short, long", got)
		}
	}
}

func TestHeimdallPresetIsTheSeedsFiveAndScorersOverrideIt(t *testing.T) {
	cfg := Config{Preset: PresetHeimdall}.WithDefaults()
	want := []string{Queue, LoadAware, ActiveRequest, SessionAffinity, NoHitLRU}
	if got := enabled(cfg.Weights); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("heimdall preset scorers %v, want %v", got, want)
	}
	for _, s := range want {
		if cfg.Weights[s] != 1 {
			t.Fatalf("heimdall preset: %s weighs %v, want 1", s, cfg.Weights[s])
		}
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Explicit scorers win over the preset.
	cfg = Config{Preset: PresetHeimdall, Weights: map[string]float64{KVCache: 2}}.WithDefaults()
	if got := enabled(cfg.Weights); fmt.Sprint(got) != fmt.Sprint([]string{KVCache}) {
		t.Fatalf("explicit scorers with a preset: %v, want only kv_cache", got)
	}
	// Configure switches a live policy to the preset and back.
	p := New(Config{})
	p.Configure(Config{Preset: PresetHeimdall})
	if got := enabled(p.Weights()); len(got) != 5 {
		t.Fatalf("after Configure(heimdall): %v", got)
	}
	p.Configure(Config{})
	if got := enabled(p.Weights()); fmt.Sprint(got) != fmt.Sprint([]string{ActiveRequest, ActiveTokens}) {
		t.Fatalf("after Configure(default): %v", got)
	}
}

func TestUnknownPresetIsRefusedNamingPreset(t *testing.T) {
	for _, cfg := range []Config{{Preset: "bogus"}, {Preset: "Heimdall"}} {
		err := cfg.WithDefaults().Validate()
		if err == nil || !strings.HasPrefix(err.Error(), "preset:") || !contains(err.Error(), cfg.Preset) {
			t.Errorf("preset %q: error %v, want one naming preset and the value", cfg.Preset, err)
		}
	}
	// Even with explicit scorers: a typo is not silently ignored.
	if err := (Config{Preset: "bogus", Weights: map[string]float64{Queue: 1}}).WithDefaults().Validate(); err == nil {
		t.Error("unknown preset with explicit scorers accepted")
	}
}
