package flow

import (
	"context"
	"testing"
)

// One replica far over its queue threshold must not close the pool's gate
// while the others are idle (issue 19): each replica counts at most 1 in
// the pool's average, so the gate closes only when every replica is full.
func TestUtilizationOneFarOverDoesNotCloseGate(t *testing.T) {
	cfg := DetectorConfig{QueueDepthThreshold: 5, KVCacheThreshold: 0.8}
	stale := fresh(0, 0)
	stale.Fresh = false
	cases := []struct {
		name string
		src  loads
		want bool // saturated
	}{
		// 20 waiting at threshold 5 scores 4; uncapped, (4+0+0+0)/4 = 1.
		{"one 4x over, three idle", loads{"a": fresh(20, 0), "b": fresh(0, 0), "c": fresh(0, 0), "d": fresh(0, 0)}, false},
		{"one far over on KV and queue, three idle", loads{"a": fresh(100, 8), "b": fresh(0, 0), "c": fresh(0, 0), "d": fresh(0, 0)}, false},
		{"three far over, one idle", loads{"a": fresh(20, 0), "b": fresh(50, 0), "c": fresh(0, 2), "d": fresh(0, 0)}, false},
		{"one stale, three idle", loads{"a": stale, "b": fresh(0, 0), "c": fresh(0, 0), "d": fresh(0, 0)}, false},
		{"all four at their thresholds", loads{"a": fresh(5, 0), "b": fresh(0, 0.8), "c": fresh(5, 0.8), "d": fresh(5, 0.1)}, true},
		{"all four over, one far over", loads{"a": fresh(20, 0), "b": fresh(6, 0), "c": fresh(0, 0.9), "d": fresh(5, 0)}, true},
		{"all full or stale", loads{"a": fresh(20, 0), "b": stale, "c": {}, "d": fresh(5, 0)}, true},
	}
	for _, tc := range cases {
		d := NewUtilizationDetector(cfg, tc.src, nil)
		s := d.Saturation(InFlight{}).Load
		if saturated(s) != tc.want {
			t.Errorf("%s: saturation %.3f, want saturated=%v", tc.name, s, tc.want)
		}
		if s > 1 {
			t.Errorf("%s: saturation %.3f above 1: a replica counted more than full", tc.name, s)
		}
	}
}

// The per-replica score itself stays uncapped: it says how far over its
// thresholds a replica is.
func TestUtilizationScoreStaysUncapped(t *testing.T) {
	d := NewUtilizationDetector(DetectorConfig{QueueDepthThreshold: 5, KVCacheThreshold: 0.8}, loads{}, nil)
	if got := d.Score(fresh(20, 0), t0); got != 4 {
		t.Fatalf("score %v, want 4 (20 waiting / 5)", got)
	}
}

// Through the controller: with one replica 4× over its threshold and three
// idle, a request is dispatched at once, not queued at the edge.
func TestUtilizationOneFarOverAdmitsAtOnce(t *testing.T) {
	src := loads{"a": fresh(20, 0), "b": fresh(0, 0), "c": fresh(0, 0), "d": fresh(0, 0)}
	det := NewUtilizationDetector(DetectorConfig{Type: DetectorUtilization, QueueDepthThreshold: 5, KVCacheThreshold: 0.8}, src, nil)
	c := newController(t, Config{}, det)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queued := false
	// Were it queued, cancel at once so the test fails fast, not at the TTL.
	tk, err := c.Enqueue(ctx, Request{FlowID: "a", Queued: func(context.Context) { queued = true; cancel() }})
	if queued || err != nil || tk == nil {
		t.Fatalf("Enqueue: queued=%v, ticket %v, err %v; want dispatched at once (saturation %.3f)",
			queued, tk, err, c.Snapshot().Saturation)
	}
	if tk.Waited != 0 {
		t.Fatalf("waited %v, want 0", tk.Waited)
	}
	tk.Release()
}
