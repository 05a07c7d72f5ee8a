package redisgate

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// concurrency_mode switched while units are held in Redis (by this
// instance, or by others still on the old config during a rolling
// change): requests and tokens are no common unit, so each mode counts
// only its own holders; the old mode's holders drain on their own.

// unitDetector is a concurrency detector of replicas × perReplica
// requests, or tokens when tokens is set.
func unitDetector(tokens bool, replicas int, perReplica int64) (flow.DetectorConfig, *flow.ConcurrencyDetector) {
	dc := flow.DetectorConfig{Type: flow.DetectorConcurrency, MaxConcurrency: perReplica}
	if tokens {
		dc = flow.DetectorConfig{Type: flow.DetectorConcurrency, ConcurrencyMode: flow.ModeTokens, MaxTokenConcurrency: perReplica}
	}
	return dc, flow.NewConcurrencyDetector(dc, func() int { return replicas })
}

// newUnitInstance starts an instance counting in requests or tokens.
func newUnitInstance(t *testing.T, conn redisconn.Config, pool, name string, tokens bool, replicas int, perReplica int64) *instance {
	t.Helper()
	g, err := New(Config{Conn: conn, Pool: pool, Instance: name, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dc, d := unitDetector(tokens, replicas, perReplica)
	g.SetLocal(d)
	ctl, err := flow.New(flow.Config{Detector: dc}, g, flow.PublishDemand(g.Feed()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close(); g.Close() })
	return &instance{name: name, ctl: ctl, gate: g}
}

// hold enqueues n requests of tokens each at in and keeps them in flight
// until the test ends.
func hold(t *testing.T, in *instance, n int, tokens int64) {
	t.Helper()
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		tk, err := in.ctl.Enqueue(ctx, flow.Request{FlowID: "t", Tokens: tokens})
		cancel()
		if err != nil {
			t.Fatalf("%s: %v (gate %+v)", in.name, err, in.gate.Stats())
		}
		t.Cleanup(func() { tk.Release() })
	}
}

// TestHeldTokensAreNotReadAsRequests: 30,000 tokens held by an instance
// in tokens mode made the pool of 4 requests look full to one in requests
// mode for as long as they were held.
func TestHeldTokensAreNotReadAsRequests(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{redistest.Addr(t)}}
	pool := uniquePool(t)
	a := newUnitInstance(t, conn, pool, "a", true, 4, 10_000)
	hold(t, a, 3, 10_000)
	eventually(t, "a holds its 30,000 tokens in Redis", func() bool { return a.gate.Stats().Held == 30_000 },
		func() any { return a.gate.Stats() })
	b := newUnitInstance(t, conn, pool, "b", false, 4, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tk, err := b.ctl.Enqueue(ctx, flow.Request{FlowID: "t", Tokens: 10_000})
	if err != nil {
		t.Fatalf("b (requests) not admitted to an idle pool of 4 requests while a holds 30,000 tokens: %v (gate b %+v)", err, b.gate.Stats())
	}
	tk.Release()
}

// TestHeldRequestsAreNotReadAsTokens: 3 requests held by an instance in
// requests mode were counted as 3 tokens by one in tokens mode (its pool
// figures mixed both).
func TestHeldRequestsAreNotReadAsTokens(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{redistest.Addr(t)}}
	pool := uniquePool(t)
	a := newUnitInstance(t, conn, pool, "a", false, 4, 1)
	hold(t, a, 3, 1000)
	eventually(t, "a holds its 3 requests in Redis", func() bool { return a.gate.Stats().Held == 3 },
		func() any { return a.gate.Stats() })
	b := newUnitInstance(t, conn, pool, "b", true, 4, 1000)
	hold(t, b, 1, 1000)
	eventually(t, "b holds its 1000 tokens", func() bool { return b.gate.Stats().Held == 1000 },
		func() any { return b.gate.Stats() })
	if s := b.gate.Stats(); s.PoolHeld != 1000 {
		t.Fatalf("b (tokens) counts %d tokens held in the pool; only its own 1000 are tokens (a's 3 requests read as tokens): %+v", s.PoolHeld, s)
	}
}

// TestModeSwitchMovesTheInstanceToTheNewUnit: an instance switched from
// requests to tokens with 2 requests (2000 tokens) in flight counts them
// in tokens, and never writes tokens where a requests-mode peer reads
// requests (2000 held would read as 2000 requests); its requests record
// lapses within a lease.
func TestModeSwitchMovesTheInstanceToTheNewUnit(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{redistest.Addr(t)}}
	pool := uniquePool(t)
	cl := redistest.Client(t, conn)
	a := newUnitInstance(t, conn, pool, "a", false, 4, 1)
	hold(t, a, 2, 1000)
	eventually(t, "a holds its 2 requests", func() bool { return a.gate.Stats().Held == 2 },
		func() any { return a.gate.Stats() })
	_, tokens := unitDetector(true, 4, 1000)
	a.gate.SetLocal(tokens)
	eventually(t, "a holds its 2000 tokens after the switch", func() bool { return a.gate.Stats().Held == 2000 },
		func() any { return a.gate.Stats() })
	requestsKeys := KeysFor("", pool)
	// What it has in flight stays counted, in requests, for instances
	// still on requests.
	if v, _ := field(t, cl, requestsKeys.Held, "a"); v != "2" {
		t.Fatalf("a's requests record after the switch: %s a = %q, want its 2 requests in flight (2000: its tokens, where requests-mode instances count requests)", requestsKeys.Held, v)
	}
	// Lapsed: its lease ran out (the next claim in requests drops it).
	eventually(t, "a's requests record lapses", func() bool {
		exp, err := cl.Do(context.Background(), cl.B().Zscore().Key(requestsKeys.Live).Member("a").Build()).AsInt64()
		if rueidis.IsRedisNil(err) {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		return exp <= redisNow(t, cl)
	})
	if s := a.gate.Stats(); s.PoolHeld != 2000 || s.RedisErrors != 0 {
		t.Fatalf("a after the switch: %+v", s)
	}
}
