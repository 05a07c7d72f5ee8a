package cacheaware

import (
	"context"
	"testing"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// sluice_cache_aware_decisions_total counts requests routed, one decision
// each: a pick whose first choice was lost before its acquire (here a
// recovering replica's one probe, taken by another request meanwhile)
// and that then went elsewhere is one decision, not two.
func TestARepickCountsOneDecision(t *testing.T) {
	p := pickerWithARecovering(t)
	var probe lb.Lease
	p.SetCapacity(&probeHook{fn: func() {
		l, err := p.Pick(context.Background(), &lb.Request{})
		if err != nil {
			t.Errorf("the pick taking the probe: %v", err)
			return
		}
		probe = l
	}})
	l, err := p.Pick(context.Background(), prompt("a prompt nobody sent before"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ok)
	if probe == nil {
		t.Fatal("the hook did not run: no repick to count")
	}
	defer probe.Release(ok)
	if l.Replica() != "b:1" || probe.Replica() != "a:1" {
		t.Fatalf("picked %s and the probe %s; want b:1 after a:1's probe went", l.Replica(), probe.Replica())
	}
	s := p.Router().Stats()
	if got := s.Hits + s.Misses + s.Imbalanced; got != 2 {
		t.Fatalf("2 requests routed, decisions counted %d (hits %d, misses %d, imbalanced %d)",
			got, s.Hits, s.Misses, s.Imbalanced)
	}
}

// A pick that finds no replica to acquire counts no decision: nothing
// was routed.
func TestAFailedPickCountsNoDecision(t *testing.T) {
	p := NewPicker(Config{}, tracker.Config{})
	p.SetReplicas([]string{"a:1"})
	req := prompt("some prompt")
	req.Unavailable = []string{"a:1"}
	if _, err := p.Pick(context.Background(), req); err == nil {
		t.Fatal("picked the only replica, which is unavailable")
	}
	if s := p.Router().Stats(); s.Hits+s.Misses+s.Imbalanced != 0 {
		t.Fatalf("no request routed, decisions counted: %+v", s)
	}
}
