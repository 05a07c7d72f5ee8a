package loadaware

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// Adaptive mode compares a time to first token with the SLO. A success
// not marked Streamed carries a time to last byte (lb.Outcome): for a
// non-streamed answer its first byte comes when the whole generation is
// done, so seconds of healthy generation read as a terrible first token
// and moved weight off the affinity scorers. Such an outcome teaches
// adaptive mode nothing; a streamed one still does.
func TestANonStreamedAnswerIsNotATimeToFirstToken(t *testing.T) {
	cfg := PickerConfig{}
	cfg.Policy = Config{Weights: map[string]float64{ActiveRequest: 1, SessionAffinity: 1},
		SLO: 300 * time.Millisecond, AdaptiveStep: 0.1}
	p := NewPicker(cfg)
	p.SetReplicas([]string{"a:1"})
	release := func(out lb.Outcome) {
		t.Helper()
		l, err := p.Pick(context.Background(), &lb.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if !l.Release(out) {
			t.Fatal("first Release did not count")
		}
	}
	for range 10 { // 20 s generations, answered whole
		release(lb.Outcome{Kind: lb.Success, Latency: 20 * time.Second, Total: 20 * time.Second, Status: 200})
	}
	if s := p.Policy().Shift(); s != 0 {
		t.Fatalf("shift %v after 10 non-streamed 20s answers under slo 300ms, want 0 (no first token was timed)", s)
	}
	// Streamed answers whose first token is late still count.
	for range 3 {
		release(lb.Outcome{Kind: lb.Success, Latency: 2 * time.Second, Streamed: true, Total: 20 * time.Second, Status: 200})
	}
	if s := p.Policy().Shift(); s == 0 {
		t.Fatalf("shift 0 after 3 streamed answers with 2s first tokens under slo 300ms, want above 0")
	}
}
