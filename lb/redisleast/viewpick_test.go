package redisleast

import (
	"testing"
	"time"
)

func TestWaterLevel(t *testing.T) {
	cases := []struct {
		scores []float64
		units  float64
		want   float64
	}{
		{[]float64{0, 1, 1, 1}, 0, 0},
		{[]float64{0, 1, 1, 1}, 0.5, 0.5},
		{[]float64{0, 1, 1, 1}, 1, 1},   // the idle one filled
		{[]float64{0, 1, 1, 1}, 3, 1.5}, // then all four rise together
		{[]float64{2, 0, 0, 5}, 1, 0.5},
		{[]float64{2, 0, 0, 5}, 4, 2},
		{[]float64{3}, 2, 5},
	}
	for _, c := range cases {
		if got := waterLevel(c.scores, c.units); got != c.want {
			t.Errorf("waterLevel(%v, %v) = %v, want %v", c.scores, c.units, got, c.want)
		}
	}
}

// With nobody else picking, a view pick is the least loaded; with picks
// the view cannot see, it spreads over the replicas they would have
// filled instead of sending every request to the one idle replica.
func TestViewPickSpreadsOverThePicksItCannotSee(t *testing.T) {
	cands := []string{"idle", "b1", "b2", "b3", "busy"}
	b := &batcher{view: map[string]int64{"idle": 0, "b1": 1, "b2": 1, "b3": 1, "busy": 3}, delta: map[string]int64{}}
	now := time.Now()
	b.viewAt = now.Add(-20 * time.Millisecond)
	picks := func() map[string]int {
		got := map[string]int{}
		for i := range 400 {
			got[b.viewPickLocked(cands, i%len(cands), now)]++
		}
		return got
	}
	if got := picks(); got["idle"] != 400 {
		t.Fatalf("no other instance picking: %v, want every pick on the idle replica", got)
	}
	b.foreignRate = 100 // 2 picks unseen in 20 ms: the idle one and one more
	got := picks()
	if got["busy"] != 0 || got["idle"] == 400 || got["idle"] == 0 {
		t.Fatalf("100 picks/s elsewhere: %v, want them over idle, b1, b2, b3 and none on busy", got)
	}
	for _, a := range []string{"b1", "b2", "b3"} {
		if got[a] == 0 {
			t.Fatalf("100 picks/s elsewhere: %v, want some on %s", got, a)
		}
	}
}

// The other instances' pick rate comes from the pool's counter less this
// instance's own picks; a counter that went back (Redis restarted) counts
// as no pick.
func TestForeignPickRate(t *testing.T) {
	b := &batcher{}
	t0 := time.Now()
	b.observePicksLocked(10, 2, t0)
	b.observePicksLocked(30, 5, t0.Add(100*time.Millisecond)) // 15 foreign in 0.1 s
	if want := foreignWeight * 150; b.foreignRate < want-1e-6 || b.foreignRate > want+1e-6 {
		t.Fatalf("rate %v, want %v", b.foreignRate, want)
	}
	before := b.foreignRate
	b.observePicksLocked(0, 0, t0.Add(200*time.Millisecond))
	if b.foreignRate >= before || b.foreignRate < 0 {
		t.Fatalf("after a counter reset: rate %v (was %v)", b.foreignRate, before)
	}
}
