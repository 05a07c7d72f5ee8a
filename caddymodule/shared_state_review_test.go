package caddymodule

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redistest"
)

// reviewState is a shared state that only describes itself.
type reviewState struct{ name string }

func (s *reviewState) Destruct() error     { return nil }
func (s *reviewState) Settings() any       { return s.name }
func (s *reviewState) Health() stateHealth { return stateHealth{} }

// takeReviewState puts a reviewState under key for the test's duration.
func takeReviewState(t *testing.T, key stateKey, name string) {
	t.Helper()
	var c stateClaims
	if _, err := c.take(key, func() (sharedState, error) { return &reviewState{name: name}, nil }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.release() })
}

// A state being built (here: until the test lets it; in production, e.g.
// a Redis that accepts connections and never answers) must not hold up
// the health answer of another pool, nor a metrics scrape.
func TestReadersDoNotWaitOnAStateBeingBuilt(t *testing.T) {
	started, release, built := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var c stateClaims
	go func() {
		_, err := c.take(stateKey{module: "review_building", pool: freshPoolName("review-building")}, func() (sharedState, error) {
			close(started)
			<-release
			return &reviewState{name: "built"}, nil
		})
		built <- err
	}()
	<-started
	healthDone, metricsDone := make(chan struct{}), make(chan struct{})
	go func() { health("review-other"); close(healthDone) }()
	go func() { _, _ = sluiceMetrics.Gather(); close(metricsDone) }()
	// Bounds the failing case only: Done stays closed once it fires.
	bound, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var blocked []string
	for what, done := range map[string]chan struct{}{"health of another pool": healthDone, "metrics scrape": metricsDone} {
		select {
		case <-done:
		case <-bound.Done():
			blocked = append(blocked, what)
		}
	}
	close(release)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	<-healthDone
	<-metricsDone
	_ = c.release()
	if len(blocked) > 0 {
		t.Fatalf("%v waited for a state of an unrelated pool still being built", blocked)
	}
}

// grlProxy is a reverse_proxy route through global_redis_least on pool,
// with dial_timeout setting the connection (each value is a variant).
func grlProxy(pool, redis, dialTimeout string) map[string]any {
	return map[string]any{"handle": []map[string]any{{
		"handler":   "reverse_proxy",
		"upstreams": []map[string]any{{"dial": "127.0.0.1:9"}},
		"load_balancing": map[string]any{"selection_policy": map[string]any{
			"policy": "global_redis_least", "pool": pool, "redis": []string{redis}, "dial_timeout": dialTimeout,
		}},
	}}}
}

// healthSettings is the JSON of pool's health settings, read n times.
func healthSettings(t *testing.T, pool string, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for range n {
		b, err := json.Marshal(health(pool).Settings)
		if err != nil {
			t.Fatal(err)
		}
		seen[string(b)]++
	}
	return seen
}

// A config with two Redis connections on one pool has two states of the
// module there; health shows one of them, the same one every time.
func TestHealthShowsOneVariantOfAPoolEveryTime(t *testing.T) {
	addr := redistest.Addr(t)
	pool := freshPoolName("review-variants")
	startProxy(t, []map[string]any{grlProxy(pool, addr, "1s"), grlProxy(pool, addr, "2s")}, nil)
	n := 0
	for _, r := range sharedStates.visible() {
		if r.key.module == "global_redis_least" && r.key.pool == pool {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("precondition: %d global_redis_least states on the pool, want 2", n)
	}
	if seen := healthSettings(t, pool, 64); len(seen) != 1 {
		t.Fatalf("64 health reads showed %d different settings: %v", len(seen), seen)
	}
}

// A state of a config still being provisioned (or one Caddy will refuse)
// is not what health shows for a pool the running config serves.
func TestHealthShowsTheRunningConfigsState(t *testing.T) {
	addr := redistest.Addr(t)
	pool := freshPoolName("review-running")
	startProxy(t, []map[string]any{grlProxy(pool, addr, "1s")}, nil)
	// The variant sorts before the running one's: only the running
	// config's claim can make health prefer that one.
	takeReviewState(t, stateKey{module: "global_redis_least", pool: pool}, "provisioning")
	takeReviewState(t, stateKey{module: "review_provisioning", pool: pool}, "provisioning")
	for s, n := range healthSettings(t, pool, 64) {
		var settings map[string]any
		if err := json.Unmarshal([]byte(s), &settings); err != nil {
			t.Fatal(err)
		}
		if settings["global_redis_least"] == "provisioning" || settings["review_provisioning"] != nil {
			t.Fatalf("%d of 64 health reads showed a state the running config does not use: %s", n, s)
		}
	}
}
