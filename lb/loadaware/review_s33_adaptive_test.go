package loadaware

import (
	"testing"
	"time"
)

// Turning adaptive mode off (a reload with slo 0) and on again later must
// start from the first byte times seen since, not from the EWMA of the
// slow period before it was turned off: that old EWMA, blended with a
// fast first byte, read as SLO pressure and moved weight off the
// affinity scorers while every request met the SLO.
func TestAdaptiveModeTurnedOffAndOnForgetsTheOldFirstByteTimes(t *testing.T) {
	cfg := Config{Weights: map[string]float64{ActiveRequest: 1, SessionAffinity: 1}, SLO: 300 * time.Millisecond, AdaptiveStep: 0.05}
	p := New(cfg)
	for range 30 {
		p.ObserveTTFT(5 * time.Second)
	}
	off := cfg
	off.SLO = 0
	p.Configure(off)
	if s := p.Shift(); s != 0 {
		t.Fatalf("slo 0: shift %v, want 0", s)
	}
	p.Configure(cfg)
	p.ObserveTTFT(100 * time.Millisecond)
	if s := p.Shift(); s != 0 {
		t.Fatalf("adaptive mode on again: shift %v after one 100ms first byte under slo 300ms, want 0", s)
	}
}
