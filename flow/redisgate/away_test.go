package redisgate

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// TestRedisAwayRetriesEverySecondNotPerRequest: while Redis is away the
// gate retries every second (docs: "retries every second"), whatever the
// traffic. Before, every request that came or went while the instance
// was on its fallback share made the claimer dial (or call) Redis again
// at once: a down Redis met a reconnect storm at the request rate.
func TestRedisAwayRetriesEverySecondNotPerRequest(t *testing.T) {
	for _, c := range []struct {
		name string
		addr func(t *testing.T) (string, func())
	}{
		// Never reached: no client yet, each retry is a dial.
		{"unreachable from the start", func(t *testing.T) (string, func()) {
			return "127.0.0.1:1", func() {}
		}},
		// Reached, then gone: each retry is a claim on the dead client.
		{"gone after the first answer", func(t *testing.T) (string, func()) {
			srv := redistest.Private(t)
			return srv.Addr, srv.Kill
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr, kill := c.addr(t)
			conn := redisconn.Config{Addrs: []string{addr}, DialTimeout: 50 * time.Millisecond}
			in := newInstance(t, conn, uniquePool(t), "a", 2, func(c *Config) { c.FallbackShare = 1 })
			if tk, err := in.ctl.Enqueue(context.Background(), flow.Request{}); err == nil {
				tk.Release() // the first answer, where there is one
			}
			kill()
			// The next request finds Redis away (and is served on the
			// fallback share).
			if tk, err := in.ctl.Enqueue(context.Background(), flow.Request{}); err == nil {
				tk.Release()
			}
			eventually(t, "the fallback share", func() bool { return in.gate.Stats().Fallback })
			before, start := in.gate.Stats().RedisErrors, time.Now()
			// Half a second of traffic: requests come and go.
			var wg sync.WaitGroup
			deadline := time.Now().Add(500 * time.Millisecond)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(deadline) {
						tk, err := in.ctl.Enqueue(context.Background(), flow.Request{})
						if err != nil {
							t.Error(err)
							return
						}
						time.Sleep(time.Millisecond)
						tk.Release()
					}
				}()
			}
			wg.Wait()
			// One retry per retryBackoff at most, however long the
			// traffic took on a busy machine (per request, it was
			// hundreds).
			allowed := 1 + uint64(time.Since(start)/retryBackoff)
			if n := in.gate.Stats().RedisErrors - before; n > allowed {
				t.Fatalf("%d Redis calls failed in %v of traffic while Redis was away; the gate retries every second (at most %d)", n, time.Since(start).Round(time.Millisecond), allowed)
			}
		})
	}
}

// TestShortLeaseOutlivesOneFailedClaim: lease_ttl may be as short as 3 ×
// read_timeout, so that a lease never lapses while it is being renewed.
// One claim that times out must not cost the instance its lease either:
// Redis back within a third of the lease, the instance renews it before
// it runs out. Before, the retry came a fixed second later, past a short
// lease: Redis dropped what the instance held while its requests ran, and
// handed those units to other instances.
func TestShortLeaseOutlivesOneFailedClaim(t *testing.T) {
	srv := redistest.Private(t)
	conn := redisconn.Config{Addrs: []string{srv.Addr}} // read_timeout 250ms
	const ttl = 900 * time.Millisecond
	pool := uniquePool(t)
	a := newInstance(t, conn, pool, "a", 2, func(c *Config) { c.LeaseTTL = ttl })
	var tks []*flow.Ticket
	for range 2 {
		tk, err := a.ctl.Enqueue(context.Background(), flow.Request{})
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	defer func() {
		for _, tk := range tks {
			tk.Release()
		}
	}()
	cl := redistest.Client(t, conn)
	k := KeysFor("", pool)
	ctx := context.Background()
	// a renews its lease, then Redis freezes for 300ms while a claims
	// again: that claim times out.
	claims := a.gate.Stats().Claims
	a.gate.poke()
	eventually(t, "a renewal", func() bool { return a.gate.Stats().Claims > claims })
	srv.Signal(syscall.SIGSTOP)
	a.gate.poke()
	time.Sleep(300 * time.Millisecond)
	srv.Signal(syscall.SIGCONT)
	if s := a.gate.Stats(); !s.Fallback {
		t.Fatalf("the claim during the freeze did not fail: %+v", s)
	}
	// For the next lease and more: a's lease never runs out while its 2
	// requests run.
	end := time.Now().Add(ttl + 500*time.Millisecond)
	for time.Now().Before(end) {
		now, err := cl.Do(ctx, cl.B().Time().Build()).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		score, err := cl.Do(ctx, cl.B().Zscore().Key(k.Live).Member("a").Build()).AsFloat64()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a's lease is gone from Redis while 2 of its requests run: %v (stats %+v)", err, a.gate.Stats())
		}
		if nowMs := float64(now[0]*1000 + now[1]/1000); err == nil && score <= nowMs {
			t.Fatalf("a's lease ran out %.0fms ago while 2 of its requests run (stats %+v)", nowMs-score, a.gate.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFallbackShareFollowsTheCapacity: while Redis is away, the fallback
// share is a part of the pool's capacity now, not of what it was at the
// last retry: replicas found after the gate fell back (none at start)
// serve the next request at once.
func TestFallbackShareFollowsTheCapacity(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{"127.0.0.1:1"}, DialTimeout: 50 * time.Millisecond}
	g, err := New(Config{Conn: conn, Pool: uniquePool(t), Instance: "a"})
	if err != nil {
		t.Fatal(err)
	}
	var replicas atomic.Int64
	fc := flow.Config{Detector: flow.DetectorConfig{Type: flow.DetectorConcurrency, MaxConcurrency: 1}}
	g.SetLocal(flow.NewConcurrencyDetector(fc.Detector, func() int { return int(replicas.Load()) }))
	ctl, err := flow.New(fc, g, flow.PublishDemand(g.Feed()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close(); g.Close() })
	eventually(t, "the fallback share of no replicas", func() bool { s := g.Stats(); return s.Fallback && s.RedisErrors >= 2 })
	replicas.Store(2)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	tk, err := ctl.Enqueue(ctx, flow.Request{})
	if err != nil {
		t.Fatalf("a request after the replicas came was not served within 500ms: %v (gate %+v)", err, g.Stats())
	}
	tk.Release()
}

// TestFallbackShareIsGivenBackWhenRedisAnswers: back from Redis being
// away, an instance that dispatched against its fallback share first
// records it (it may be using it), then gives back at once what it does
// not use (docs: "giving back at once what the fallback share took beyond
// its fair share"). Before, an idle instance kept the whole fallback
// share in Redis until its next lease renewal (lease_ttl/3), and requests
// at every other instance waited for it meanwhile.
func TestFallbackShareIsGivenBackWhenRedisAnswers(t *testing.T) {
	srv := redistest.Private(t)
	conn := redisconn.Config{Addrs: []string{srv.Addr}}
	pool := uniquePool(t)
	const capacity = 4
	// Renewal every 10 s: the bound below (5 s) tells "at once" from "at
	// the renewal" with room for a busy machine.
	slowRenewal := func(c *Config) { c.LeaseTTL = 30 * time.Second }
	a := newInstance(t, conn, pool, "a", capacity, slowRenewal)
	tk, err := a.ctl.Enqueue(context.Background(), flow.Request{})
	if err != nil {
		t.Fatal(err)
	}
	tk.Release()
	eventually(t, "a idle", func() bool { s := a.gate.Stats(); return s.Held == 0 && s.Claims >= 2 })
	// Redis freezes while a claims: a falls back to the whole pool (it
	// was alone at its last answer), then Redis answers again.
	srv.Signal(syscall.SIGSTOP)
	a.gate.poke()
	time.Sleep(400 * time.Millisecond)
	srv.Signal(syscall.SIGCONT)
	if s := a.gate.Stats(); !s.Fallback || s.Allowed != capacity {
		t.Fatalf("a not on its fallback share of the whole pool: %+v", s)
	}
	eventually(t, "a back on the global count", func() bool { return !a.gate.Stats().Fallback })
	// Another instance's request is served at once: a, idle, holds none
	// of the pool.
	b := newInstance(t, conn, pool, "b", capacity, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tk, err = b.ctl.Enqueue(ctx, flow.Request{})
	if err != nil {
		t.Fatalf("b's request waited over 5 s (a's renewal is every 10 s): %v (a %+v, b %+v)", err, a.gate.Stats(), b.gate.Stats())
	}
	tk.Release()
}
