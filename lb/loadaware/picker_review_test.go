package loadaware

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// A set-backends that lands between a pick's ranking and its acquisition
// (Explain runs between the two) removes the replica it chose. The
// request must go to a replica of the set in force, not fail with "no
// backends" while that set has replicas (a 503 during a rolling update).
func TestAPickWhoseChoiceLeavesTheSetGoesToTheNewSet(t *testing.T) {
	p := NewPicker(PickerConfig{})
	p.SetReplicas([]string{"a:1", "b:1"})
	busy := p.Tracker().Acquire("b:1") // a is the lighter: ranked first
	defer busy.Release(lb.Outcome{Kind: lb.Success})
	once := false
	p.Explain = func(e Explanation) {
		if !once {
			once = true
			if e.Picked != "a:1" {
				t.Errorf("ranked %s first; the test wants a:1", e.Picked)
			}
			p.SetReplicas([]string{"b:1"})
		}
	}
	l, err := p.Pick(context.Background(), &lb.Request{})
	if err != nil {
		t.Fatalf("Pick = %v; the set in force has b:1", err)
	}
	defer l.Release(lb.Outcome{Kind: lb.Success})
	if l.Replica() != "b:1" {
		t.Fatalf("picked %s, not in the set in force [b:1]", l.Replica())
	}
}

// A replica whose down time is over takes one probe at a time: a pick
// that ranked it usable but acquires it after another pick's probe went
// (Explain runs between ranking and acquisition) goes elsewhere, not
// send a second request to a replica that just failed.
func TestOnlyOneProbeAtATimeWhenPicksRace(t *testing.T) {
	p := NewPicker(PickerConfig{Tracker: tracker.Config{FailDuration: time.Nanosecond}})
	p.SetReplicas([]string{"a:1", "b:1"})
	p.Tracker().Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure})
	for { // 1ns of down time: over at once
		if _, usable := p.Tracker().Load("a:1"); usable {
			break
		}
	}
	for range 2 { // a is the lighter: ranked first
		busy := p.Tracker().Acquire("b:1")
		defer busy.Release(lb.Outcome{Kind: lb.Success})
	}
	var probe lb.Lease
	nested := false
	p.Explain = func(e Explanation) {
		if nested {
			return
		}
		nested = true
		l, err := p.Pick(context.Background(), &lb.Request{})
		if err != nil || l.Replica() != "a:1" {
			t.Fatalf("the first pick after the down time: %v %v; want the probe on a:1", l, err)
		}
		probe = l
	}
	l, err := p.Pick(context.Background(), &lb.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(lb.Outcome{Kind: lb.Success})
	defer probe.Release(lb.Outcome{Kind: lb.Failure})
	if n := p.InFlight()["a:1"]; n != 1 || l.Replica() != "b:1" {
		t.Fatalf("picked %s; %d requests in flight on a:1, which failed: want 1 probe and this pick on b:1", l.Replica(), n)
	}
}
