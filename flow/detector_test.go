package flow

import (
	"math"
	"testing"
	"time"
)

type loads map[string]ReplicaLoad

func (l loads) Replicas() []string {
	out := make([]string, 0, len(l))
	for a := range l {
		out = append(out, a)
	}
	return out
}

func (l loads) Load(addr string) ReplicaLoad { return l[addr] }

func fresh(waiting, kv float64) ReplicaLoad {
	return ReplicaLoad{Waiting: waiting, KVCacheUsage: kv, HaveWaiting: true, HaveKVCache: true, At: t0, Fresh: true}
}

func TestUtilizationDetector(t *testing.T) {
	cfg := DetectorConfig{QueueDepthThreshold: 5, KVCacheThreshold: 0.8}
	stale := fresh(0, 0)
	stale.Fresh = false
	cases := []struct {
		name string
		src  loads
		want bool // saturated
	}{
		{"no replicas", loads{}, true},
		{"all idle", loads{"a": fresh(0, 0), "b": fresh(1, 0.2)}, false},
		{"all at the queue threshold", loads{"a": fresh(5, 0), "b": fresh(5, 0.1)}, true},
		{"all at the KV threshold", loads{"a": fresh(0, 0.8), "b": fresh(1, 0.9)}, true},
		{"all over one or the other", loads{"a": fresh(6, 0), "b": fresh(0, 0.85)}, true},
		{"all stale", loads{"a": stale, "b": stale}, true},
		{"unknown (never scraped)", loads{"a": {}, "b": {}}, true},
		{"stale and full", loads{"a": stale, "b": fresh(5, 0.8)}, true},
		{"one has room", loads{"a": fresh(5, 0.8), "b": stale, "c": fresh(0, 0)}, false},
		{"one just below both thresholds", loads{"a": fresh(5, 0), "b": fresh(4, 0.79)}, false},
		// The seed's unweighted average, with each score counted at most
		// 1: a replica far over its threshold no longer closes the gate
		// while another has room.
		{"average: one far over", loads{"a": fresh(15, 0), "b": fresh(0, 0)}, false},
		{"only waiting exported", loads{"a": {Waiting: 2, HaveWaiting: true, Fresh: true}}, false},
		{"only KV exported, full", loads{"a": {KVCacheUsage: 0.9, HaveKVCache: true, Fresh: true}}, true},
		{"fresh but exports nothing", loads{"a": {Fresh: true}}, true},
	}
	for _, tc := range cases {
		d := NewUtilizationDetector(cfg, tc.src, nil)
		s := d.Saturation(InFlight{}).Load
		if saturated(s) != tc.want {
			t.Errorf("%s: saturation %.3f, want saturated=%v", tc.name, s, tc.want)
		}
	}
}

func TestUtilizationScoreIsRoofline(t *testing.T) {
	d := NewUtilizationDetector(DetectorConfig{}, loads{}, nil) // defaults: 5 waiting, 0.8 KV
	if got := d.Score(fresh(2.5, 0.2), t0); got != 0.5 {
		t.Fatalf("score %v, want 0.5 (waiting 2.5/5 dominates KV 0.2/0.8)", got)
	}
	if got := d.Score(fresh(1, 0.6), t0); math.Abs(got-0.75) > 1e-9 {
		t.Fatalf("score %v, want 0.75 (KV 0.6/0.8)", got)
	}
	if got := d.Saturation(InFlight{Requests: 1e6}).Load; got != 1 {
		t.Fatalf("empty pool: %v", got)
	}
}

func TestUtilizationMetricsStaleness(t *testing.T) {
	clk := newFakeClock()
	src := loads{"a": fresh(0, 0)} // read at t0
	d := NewUtilizationDetector(DetectorConfig{MetricsStaleness: 200 * time.Millisecond}, src, clk)
	clk.Advance(200 * time.Millisecond)
	if saturated(d.Saturation(InFlight{}).Load) {
		t.Fatal("saturated at exactly the staleness threshold")
	}
	clk.Advance(time.Millisecond)
	if !saturated(d.Saturation(InFlight{}).Load) {
		t.Fatal("sample older than metrics_staleness_threshold not treated as saturated")
	}
	// Without the threshold, the source's own freshness decides.
	if saturated(NewUtilizationDetector(DetectorConfig{}, src, clk).Saturation(InFlight{}).Load) {
		t.Fatal("saturated though the source says fresh and no threshold is set")
	}
}

func TestConcurrencyDetector(t *testing.T) {
	d := slots(4)
	for n, want := range map[int64]bool{0: false, 3: false, 4: true, 5: true} {
		if got := saturated(d.Saturation(InFlight{Requests: n}).Load); got != want {
			t.Errorf("requests mode, %d in flight of 4: saturated=%v", n, got)
		}
	}
	replicas := 3
	perReplica := NewConcurrencyDetector(DetectorConfig{MaxConcurrency: 10, Headroom: 0.2}, func() int { return replicas })
	if saturated(perReplica.Saturation(InFlight{Requests: 29}).Load) || !saturated(perReplica.Saturation(InFlight{Requests: 30}).Load) {
		t.Error("3 replicas × 10 should saturate at 30 in flight")
	}
	if got := perReplica.ReplicaLimit(); math.Abs(got-12) > 1e-9 {
		t.Errorf("replica limit %v, want 10 × 1.2", got)
	}
	replicas = 0
	if !saturated(perReplica.Saturation(InFlight{}).Load) {
		t.Error("no replica, yet not saturated")
	}
	tok := NewConcurrencyDetector(DetectorConfig{ConcurrencyMode: ModeTokens, MaxTokenConcurrency: 1000}, nil)
	if saturated(tok.Saturation(InFlight{Requests: 500, Tokens: 999}).Load) || !saturated(tok.Saturation(InFlight{Requests: 1, Tokens: 1000}).Load) {
		t.Error("tokens mode must count tokens, not requests")
	}
}

func TestSaturatedRule(t *testing.T) {
	if saturated(0.999) || !saturated(1) || !saturated(math.NaN()) || !saturated(math.Inf(1)) {
		t.Fatal("gate rule: closed at ≥ 1 and on NaN")
	}
}

// TestTokensModeGatesController: in tokens mode the controller's token
// accounting, fed by Request.Tokens, closes the gate.
func TestTokensModeGatesController(t *testing.T) {
	c := newController(t, Config{}, NewConcurrencyDetector(DetectorConfig{ConcurrencyMode: ModeTokens, MaxTokenConcurrency: 100}, nil))
	big, err := c.Enqueue(t.Context(), Request{Tokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 1)
	enqueueAsync(t.Context(), c, Request{Tokens: 1}, out)
	waitQueued(t, c, 1)
	big.Release()
	if r := <-out; r.err != nil {
		t.Fatal(r.err)
	}
}
