package cacheaware

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// probeHook is a capacity source that runs once, the first time the
// router asks it for a size: Pick calls it between reading the replicas'
// loads and acquiring its choice, where another request's pick can land.
type probeHook struct {
	once sync.Once
	fn   func()
}

func (h *probeHook) Tokens(string) (int, bool) {
	h.once.Do(h.fn)
	return 1000, true
}

// pickerWithARecovering is a picker over a:1 and b:1 where a:1 failed and
// its down time is over (it takes one probe) and b:1 holds two requests
// until the test ends: a is the lighter, chosen first.
func pickerWithARecovering(t *testing.T) *Picker {
	t.Helper()
	p := NewPicker(Config{}, tracker.Config{FailDuration: time.Nanosecond})
	p.SetReplicas([]string{"a:1", "b:1"})
	p.Tracker().Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure})
	for { // 1ns of down time: over at once
		if _, usable := p.Tracker().Load("a:1"); usable {
			break
		}
	}
	for range 2 {
		busy := p.Tracker().Acquire("b:1")
		t.Cleanup(func() { busy.Release(ok) })
	}
	return p
}

// A replica whose down time is over takes one probe at a time: a pick
// that read it usable but acquires it after another pick's probe went
// goes elsewhere, not send a second request to a replica that just failed.
func TestOnlyOneProbeAtATimeWhenPicksRace(t *testing.T) {
	p := pickerWithARecovering(t)
	var probe lb.Lease
	p.SetCapacity(&probeHook{fn: func() {
		// Another request, without a prompt (it neither asks for a size
		// nor writes the tree, whose read lock this pick holds).
		l, err := p.Pick(context.Background(), &lb.Request{})
		if err != nil || l.Replica() != "a:1" {
			t.Errorf("the first pick after the down time: %v %v; want the probe on a:1", l, err)
		}
		probe = l
	}})
	l, err := p.Pick(context.Background(), prompt("a prompt nobody sent before"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ok)
	if probe != nil {
		defer probe.Release(lb.Outcome{Kind: lb.Failure})
	}
	if n := p.InFlight()["a:1"]; n != 1 || l.Replica() != "b:1" {
		t.Fatalf("picked %s; %d requests in flight on a:1, which failed: want 1 probe and this pick on b:1", l.Replica(), n)
	}
}

// A replica that leaves the set while requests are being picked leaves
// the tree entirely (no holding of it stays, whatever picks and inserts
// ran meanwhile), and when it comes back it starts empty and healthy: the
// prompts it held before go by the tree to the replicas that still hold
// them, not to it.
func TestALeavingReplicaIsForgottenAndComesBackCleanUnderConcurrentPicks(t *testing.T) {
	p := NewPicker(Config{MaxTreeSize: 1 << 20}, tracker.Config{FailDuration: time.Hour})
	all := []string{"a:1", "b:1", "c:1"}
	p.SetReplicas(all)
	const pickers = 4
	var wg sync.WaitGroup
	pause := make(chan chan struct{}) // a picker that receives one waits until it is closed
	stop := make(chan struct{})
	for g := range pickers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case gate := <-pause:
					<-gate
				default:
				}
				l, err := p.Pick(context.Background(), prompt(fmt.Sprintf("system %d: question %d %d", i%7, g, i%97)))
				if err != nil {
					t.Errorf("pick: %v", err) // and go on: paused() counts on every picker
					continue
				}
				l.Release(ok)
			}
		})
	}
	paused := func() chan struct{} {
		gate := make(chan struct{})
		for range pickers {
			pause <- gate
		}
		return gate
	}
	for round := range 30 {
		p.SetReplicas([]string{"b:1", "c:1"})
		gate := paused()
		check(t, p.Router())
		p.Router().mu.RLock()
		for _, root := range p.Router().trees {
			var walk func(n *node)
			walk = func(n *node) {
				for kid := range n.allKids() {
					for _, h := range kid.holders {
						if h.rep.addr == "a:1" || h.rep.dead {
							t.Errorf("round %d: %s still holds %q after it left", round, h.rep.addr, kid.label)
						}
					}
					walk(kid)
				}
			}
			walk(root)
		}
		p.Router().mu.RUnlock()
		if _, in := p.Router().Stats().ReplicaChars["a:1"]; in {
			t.Fatalf("round %d: a:1 in the stats after it left", round)
		}
		// It failed just before it left (a lease of the old set).
		if l := p.Tracker().Acquire("a:1"); l != nil {
			t.Fatalf("round %d: the tracker still lets a:1, which left, take a request", round)
		}

		p.SetReplicas(all)
		if n := p.Router().Stats().ReplicaChars["a:1"]; n != 0 {
			t.Fatalf("round %d: a:1 came back holding %d chars", round, n)
		}
		if n, usable := p.Tracker().Load("a:1"); n != 0 || !usable {
			t.Fatalf("round %d: a:1 came back with %d in flight, usable %v", round, n, usable)
		}
		check(t, p.Router())
		// Mark a down now; it must come back up next round.
		if l := p.Tracker().Acquire("a:1"); l != nil {
			l.Release(lb.Outcome{Kind: lb.Failure})
		}
		close(gate)
	}
	close(stop)
	wg.Wait()
	if n := p.Tracker().InFlight(); n != 0 {
		t.Fatalf("in flight %d after every release", n)
	}
}

// The longest prefix counts among the replicas that may get the request:
// when the replica holding the most of a prompt is down after failures
// (or unavailable: a retry after it failed), the prompt goes to the one
// holding the next longest prefix above the threshold, as a cache hit,
// not to the least loaded replica as if no replica held any of it.
func TestAnUnusableLongestHolderLeavesTheHitToTheNextHolder(t *testing.T) {
	r := newRouter(t, Config{}, "a", "b", "c")
	system := "a long shared system prompt that most of every request is made of, "
	r.Insert("m", system+"turn one", "b")
	r.Insert("m", system+"turn one, turn two", "a")
	text := system + "turn one, turn two, turn three"
	aDown := func(addr string) (int, bool) {
		return map[string]int{"b": 3, "c": 0}[addr], addr != "a"
	}
	if d := r.Pick("m", text, aDown); d.Reason != CacheHit || d.Addr != "b" {
		t.Fatalf("a (the longest holder) down: got %+v, want a cache hit on b, which holds %d of %d chars",
			d, len(system+"turn one"), len(text))
	}

	p := newPicker(t, "a:1", "b:1", "c:1")
	p.Router().Insert("m", system+"turn one", "b:1")
	p.Router().Insert("m", system+"turn one, turn two", "a:1")
	busy := p.Tracker().Acquire("b:1") // c is the least loaded
	defer busy.Release(ok)
	req := prompt(text)
	req.Unavailable = []string{"a:1"}
	l, d := pickDecided(t, p, req)
	defer l.Release(ok)
	if l.Replica() != "b:1" || d.Reason != CacheHit {
		t.Fatalf("retry without a:1: went to %s (%+v), want a cache hit on b:1", l.Replica(), d)
	}
}
