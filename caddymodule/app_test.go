package caddymodule

import (
	"sync"
	"testing"
)

// The order Caddy drives the sluice app through: a normal reload starts
// the new config's app and then stops the old one (the new settings stay);
// an aborted start stops the new app while the old one still runs (the
// old settings come back).
func TestAppAppliesTheSettingsOfTheConfigThatRuns(t *testing.T) {
	var mu sync.Mutex
	inForce := ""
	set := func(v string) func() { return func() { mu.Lock(); inForce = v; mu.Unlock() } }
	current := func() string { mu.Lock(); defer mu.Unlock(); return inForce }
	key := stateKey{module: "test", pool: "p"}
	newApp := func(v string) *App {
		a := &App{mu: new(sync.Mutex)}
		if err := a.register(pendingSettings{key: key, fingerprint: v, apply: set(v)}); err != nil {
			t.Fatal(err)
		}
		return a
	}

	one := newApp("one")
	one.Start()
	if current() != "one" {
		t.Fatalf("after the first start: %q", current())
	}
	two := newApp("two") // a reload whose start Caddy aborts
	if current() != "one" {
		t.Fatal("provisioning a config applied its settings")
	}
	two.Start()
	two.Stop()
	if current() != "one" {
		t.Fatalf("after an aborted start: %q in force, want the running config's", current())
	}
	three := newApp("three") // a reload that succeeds
	three.Start()
	one.Stop()
	if current() != "three" {
		t.Fatalf("after a good reload: %q", current())
	}
	three.Stop() // shutdown

	conflict := newApp("a")
	if err := conflict.register(pendingSettings{key: key, fingerprint: "b", apply: set("b")}); err == nil {
		t.Fatal("two different settings for one pool in one config were accepted")
	}
}
