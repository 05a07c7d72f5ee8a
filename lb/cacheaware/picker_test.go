package cacheaware

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

func newPicker(t *testing.T, addrs ...string) *Picker {
	t.Helper()
	p := NewPicker(Config{}, tracker.Config{})
	p.SetReplicas(addrs)
	return p
}

func pickFor(t *testing.T, p *Picker, req *lb.Request) lb.Lease {
	t.Helper()
	l, err := p.Pick(context.Background(), req)
	if err != nil {
		t.Fatalf("Pick(unavailable %v): %v", req.Unavailable, err)
	}
	return l
}

// pickDecided is pickFor, with the Decision that chose.
func pickDecided(t *testing.T, p *Picker, req *lb.Request) (lb.Lease, Decision) {
	t.Helper()
	l, d, err := p.PickDecision(context.Background(), req)
	if err != nil {
		t.Fatalf("Pick(unavailable %v): %v", req.Unavailable, err)
	}
	return l, d
}

func prompt(text string) *lb.Request {
	return &lb.Request{Model: "m", Text: text, Parsed: true, Tokens: 10}
}

var ok = lb.Outcome{Kind: lb.Success, Latency: time.Millisecond}

func TestPickerFollowsTheCacheAndRecordsThePrompt(t *testing.T) {
	p := newPicker(t, "a:1", "b:1")
	text := strings.Repeat("a shared system prompt ", 4)
	first := pickFor(t, p, prompt(text))
	first.Release(ok)
	req := prompt(text + "and a question")
	l, d := pickDecided(t, p, req)
	if l.Replica() != first.Replica() {
		t.Fatalf("second request went to %s, the prefix is on %s", l.Replica(), first.Replica())
	}
	if d.Reason != CacheHit || d.Addr != l.Replica() {
		t.Fatalf("decision %#v, want the cache-hit Decision", d)
	}
	if tl, ok := l.(*tracker.Lease); !ok || tl.Addr != l.Replica() {
		t.Fatalf("lease %T, want the tracker's lease", l)
	}
	l.Release(ok)
	if n := p.Tracker().InFlight(); n != 0 {
		t.Fatalf("in flight %d", n)
	}
}

// The replica holding the prefix is unavailable (the proxy's view): the
// request goes elsewhere, and its prompt is recorded there.
func TestPickerSkipsUnavailableEvenOnACacheHit(t *testing.T) {
	p := newPicker(t, "a:1", "b:1")
	text := strings.Repeat("the prompt everyone sends ", 4)
	holder := pickFor(t, p, prompt(text))
	holder.Release(ok)
	other := map[string]string{"a:1": "b:1", "b:1": "a:1"}[holder.Replica()]

	req := prompt(text)
	req.Unavailable = []string{holder.Replica(), "unknown:1"}
	l, d := pickDecided(t, p, req)
	if l.Replica() != other {
		t.Fatalf("went to %s, which the proxy reports unavailable", l.Replica())
	}
	if d.Reason != Miss {
		t.Fatalf("decision %+v, want a miss (the only holder is unavailable)", d)
	}
	l.Release(ok)
	if got := p.Router().Stats().ReplicaChars[other]; got == 0 {
		t.Fatalf("the prompt was not recorded for %s, which served it", other)
	}
}

func TestPickerRefusals(t *testing.T) {
	p := newPicker(t)
	if _, err := p.Pick(context.Background(), prompt("x")); !errors.Is(err, lb.ErrNoBackends) {
		t.Fatalf("empty pool: %v, want ErrNoBackends", err)
	}
	p.SetReplicas([]string{"a:1", "b:1"})
	req := prompt("x")
	req.Unavailable = []string{"a:1", "b:1"}
	if _, err := p.Pick(context.Background(), req); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("every replica unavailable: %v, want ErrAllDown", err)
	}
	// a down after a failure, b unavailable: nothing usable either.
	l := pickFor(t, p, &lb.Request{Unavailable: []string{"b:1"}})
	l.Release(lb.Outcome{Kind: lb.Failure, Status: 502})
	req.Unavailable = []string{"b:1"}
	if _, err := p.Pick(context.Background(), req); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("a down, b unavailable: %v, want ErrAllDown", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Pick(ctx, prompt("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	if l, err := p.Pick(context.Background(), nil); err != nil {
		t.Fatalf("nil request: %v", err)
	} else {
		l.Release(ok)
	}
	if n := p.Tracker().InFlight(); n != 0 {
		t.Fatalf("in flight %d", n)
	}
}

// Only a parsed request's text goes into the tree.
func TestPickerRecordsOnlyParsedPrompts(t *testing.T) {
	p := newPicker(t, "a:1")
	req := &lb.Request{Model: "m", Text: "raw bytes that are not a prompt", Parsed: false}
	pickFor(t, p, req).Release(ok)
	pickFor(t, p, &lb.Request{Model: "m", Parsed: true}).Release(ok)
	if s := p.Router().Stats(); s.Chars != 0 {
		t.Fatalf("tree holds %d chars after requests without a parsed prompt", s.Chars)
	}
	pickFor(t, p, prompt("a real prompt")).Release(ok)
	if s := p.Router().Stats(); s.Chars != len("a real prompt") {
		t.Fatalf("tree holds %d chars, want %d", s.Chars, len("a real prompt"))
	}
}

func TestPickerSettings(t *testing.T) {
	p := NewPicker(Config{}, tracker.Config{})
	p.Configure(Config{CacheThreshold: 0.8, MaxTreeSize: 500}, tracker.Config{MaxFails: 3})
	s := p.Settings().(PickerSettings)
	if s.Router.CacheThreshold != 0.8 || s.Router.MaxTreeSize != 500 || s.Tracker.MaxFails != 3 {
		t.Fatalf("settings %+v", s)
	}
}

// A reload that shortens eviction_interval applies at once, not when the
// old interval ends.
func TestRunFollowsANewEvictionInterval(t *testing.T) {
	cfg := Config{MaxTreeSize: 100, EvictionInterval: time.Hour}
	r := newRouter(t, cfg, "a")
	r.Insert("m", strings.Repeat("x", 100), "a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// Let Run arm its hour-long wait first. The test passes either way;
	// without the pause it could not tell a Run that ignores Configure.
	time.Sleep(20 * time.Millisecond)

	cfg.EvictionInterval = time.Millisecond
	r.Configure(cfg)
	deadline := time.Now().Add(5 * time.Second) // bounds a broken test only
	for r.Stats().Chars > cfg.WithDefaults().lowWater() {
		if time.Now().After(deadline) {
			t.Fatalf("no eviction run after Configure set a 1ms interval: %d chars", r.Stats().Chars)
		}
		time.Sleep(time.Millisecond)
	}
}
