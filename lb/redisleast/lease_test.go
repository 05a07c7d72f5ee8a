package redisleast

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

func TestCrashedInstanceIsReclaimed(t *testing.T) { redistest.Each(t, testCrashedInstanceIsReclaimed) }

func testCrashedInstanceIsReclaimed(t *testing.T, tg redistest.Target) {
	cfg := confFor(t, tg)
	cfg.LeaseTTL = 500 * time.Millisecond
	reps := []string{"a", "b", "c"}
	dead, reaper, live := newStore(t, cfg, "p"), newStore(t, cfg, "p"), newStore(t, cfg, "p")
	if err := reaper.Sync(context.Background(), reps); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		sel(t, dead, reps...)
	}
	kept := []*Lease{sel(t, live, reps...), sel(t, live, reps...)}

	dead.crash()
	died := time.Now()
	waitFor(t, "the dead instance's requests to be reclaimed", func() bool {
		sum := int64(0)
		for _, n := range mustCounts(t, reaper) {
			sum += n
		}
		return sum == 2
	})
	t.Logf("reclaimed %v after the crash (bound: LeaseTTL %v + reap interval %v)",
		time.Since(died).Round(time.Millisecond), cfg.LeaseTTL, reaper.reapInterval())
	if got := reaper.Stats().Reclaimed + live.Stats().Reclaimed; got != 4 {
		t.Fatalf("reclaimed %d requests, want 4 (each exactly once)", got)
	}
	// The live instance outlived several TTLs; its requests still count
	// and still release normally.
	for _, l := range kept {
		l.Release(lb.Outcome{Kind: lb.Success})
	}
	if !drained(t, reaper, rawFor(t, tg)) {
		t.Fatalf("counts %v after the live instance released", mustCounts(t, reaper))
	}
}

// Releases Redis could not take are sent when it answers again: Redis
// frozen (SIGSTOP) keeps its state, so the counts prove the pending queue.
// Then Redis killed and restarted empty: the member set is replayed, and
// after every release all counts are 0. Selects never wait longer than
// ReadTimeout.
func TestBreakerFallbackAndConvergence(t *testing.T) {
	srv := privateRedis(t)
	cfg := testConfig(t, srv.Addr)
	cfg.ReadTimeout = 300 * time.Millisecond
	cfg.BreakerFailures = 2
	cfg.BreakerBackoff = 50 * time.Millisecond
	cfg.LeaseTTL = 5 * time.Second
	s := newStore(t, cfg, "p")
	reps := []string{"a", "b", "c", "d"}
	ctx := context.Background()
	if err := s.Sync(ctx, reps); err != nil {
		t.Fatal(err)
	}

	var slowest time.Duration
	var held []*Lease
	selectSome := func(n int) {
		for range n {
			start := time.Now()
			l, err := s.Select(ctx, reps)
			slowest = max(slowest, time.Since(start))
			if err != nil {
				t.Fatalf("select: %v", err)
			}
			held = append(held, l)
		}
	}
	releaseAll := func() {
		for _, l := range held {
			l.Release(lb.Outcome{Kind: lb.Success})
		}
		held = nil
	}

	// Phase 1: frozen Redis.
	selectSome(6)
	srv.Signal(syscall.SIGSTOP)
	selectSome(20) // the first times out and opens the breaker; the rest fall back
	if s.Stats().Breaker != Open {
		t.Fatal("breaker still closed with Redis frozen")
	}
	releaseAll() // 6 queued for later, 20 local only
	if p := s.Stats().Pending; p < 6 {
		t.Fatalf("pending releases %d, want at least the 6 Redis leases", p)
	}
	srv.Signal(syscall.SIGCONT)
	waitFor(t, "the breaker to close", func() bool { return s.Stats().Breaker == Closed && s.Stats().Pending == 0 })
	if !drained(t, s, raw(t, srv.Addr)) {
		t.Fatalf("after thaw: counts %v", mustCounts(t, s))
	}

	// Phase 2: Redis killed mid-load and restarted empty on the same port.
	selectSome(5)
	srv.Kill()
	selectSome(20)
	releaseAll()
	// Batched (the default), picks after the first failure come from the
	// view without a call; the flusher's retries of the failed batch open
	// the breaker.
	waitFor(t, "the breaker to open with Redis dead", func() bool { return s.Stats().Breaker == Open })
	restarted, err := redistest.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Kill)
	waitFor(t, "the breaker to close after restart", func() bool { return s.Stats().Breaker == Closed })
	selectSome(8) // via Redis again
	if held[0].Fallback {
		t.Fatal("still falling back after recovery")
	}
	if got := mustCounts(t, s); len(got) != len(reps) {
		t.Fatalf("member set after restart %v, want %v replayed", got, reps)
	}
	releaseAll()
	// Releases beyond the call budget go with the next batch.
	waitFor(t, "every release to reach Redis after the restart", func() bool { return drained(t, s, raw(t, srv.Addr)) })

	st := s.Stats()
	if st.Fallbacks < 30 || st.Errors == 0 || st.Selections != st.Releases {
		t.Fatalf("stats %+v", st)
	}
	// Hang guard rather than a performance assertion: the bound is
	// ReadTimeout; the margin only absorbs a slow machine.
	if slowest > cfg.ReadTimeout+2*time.Second {
		t.Fatalf("a select waited %v; ReadTimeout is %v", slowest, cfg.ReadTimeout)
	}
	t.Logf("slowest select %v (ReadTimeout %v), %d fallbacks, %d errors", slowest, cfg.ReadTimeout, st.Fallbacks, st.Errors)
}

// A pending queue that overflows makes the instance abandon its identity;
// the reapers then reclaim everything recorded under the old one.
func TestPendingOverflowRotatesIdentity(t *testing.T) {
	redistest.Each(t, testPendingOverflowRotatesIdentity)
}

func testPendingOverflowRotatesIdentity(t *testing.T, tg redistest.Target) {
	cfg := confFor(t, tg)
	cfg.PendingMax = 2
	cfg.LeaseTTL = 300 * time.Millisecond
	cfg.BreakerBackoff = time.Hour // the test closes the breaker itself
	s, reaper := newStore(t, cfg, "p"), newStore(t, cfg, "p")
	if err := s.Sync(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	ls := []*Lease{sel(t, s, "a"), sel(t, s, "a"), sel(t, s, "b")}
	before := s.InstanceID()
	s.br.record(context.DeadlineExceeded) // as if Redis had timed out
	for _, l := range ls {
		l.Release(lb.Outcome{Kind: lb.Success})
	}
	if s.InstanceID() == before || s.Stats().Pending != 0 {
		t.Fatalf("no rotation on overflow: id %s → %s, pending %d", before, s.InstanceID(), s.Stats().Pending)
	}
	s.br.close()
	waitFor(t, "the abandoned identity to be reclaimed", func() bool { return drained(t, reaper, rawFor(t, tg)) })
	if l := sel(t, s, "a", "b"); l.Fallback {
		t.Fatal("fallback after the breaker closed")
	} else {
		l.Release(lb.Outcome{Kind: lb.Success})
	}
	wantCounts(t, s, map[string]int64{"a": 0, "b": 0})
}

// A proxy restarted during a Redis outage must serve: the store starts
// with the breaker open (local fallback) and connects when Redis comes
// up, replaying the member set. Both modes; in queueing mode the waiters'
// notifications must work once connected.
func TestStartsWithoutRedisAndConnectsWhenItComes(t *testing.T) {
	for _, queueing := range []bool{false, true} {
		t.Run(fmt.Sprintf("queueing=%v", queueing), func(t *testing.T) {
			privateRedis(t) // skip rules (and a server this test does not use)
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close() // nothing listens there now
			cfg := testConfig(t, addr)
			if queueing {
				cfg = queueConfig(t, addr)
			}
			cfg.ReadTimeout = 300 * time.Millisecond
			cfg.DialTimeout = 300 * time.Millisecond
			cfg.BreakerBackoff = 50 * time.Millisecond
			start := time.Now()
			s := newStore(t, cfg, "p")
			if s.Unreachable() == nil || s.Stats().Breaker != Open {
				t.Fatalf("started against a closed port: unreachable %v, breaker %v", s.Unreachable(), s.Stats().Breaker)
			}
			if waited := time.Since(start); waited > 5*time.Second {
				t.Fatalf("New took %v with Redis down", waited) // hang guard
			}
			reps := []string{"a", "b"}
			if err := s.Sync(context.Background(), reps); err == nil {
				t.Fatal("Sync with the breaker open must say so")
			}
			l1, err := s.Select(context.Background(), reps)
			if err != nil || !l1.Fallback {
				t.Fatalf("a select with Redis down must fall back locally: %v", err)
			}
			l1.Release(ok)

			srv, err := redistest.Start(addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Kill)
			waitFor(t, "the store to connect", func() bool { return s.Stats().Breaker == Closed })
			c := raw(t, addr)
			wantCounts(t, s, map[string]int64{"a": 0, "b": 0}) // the member set, replayed
			held := []*Lease{sel(t, s, reps...), sel(t, s, reps...)}
			for _, h := range held {
				if h.Fallback {
					t.Fatal("still falling back once Redis is up")
				}
			}
			if queueing {
				// Both slots taken: the next one waits and is handed the
				// first slot released (pub/sub works on the new connection).
				out := make(chan got, 1)
				enqueue(t, context.Background(), c, s, "waiter", out, reps...)
				held[0].Release(ok)
				g := <-out
				if g.err != nil || g.l.Fallback {
					t.Fatalf("waiter: %v (fallback %v)", g.err, g.l != nil && g.l.Fallback)
				}
				held[0] = g.l
			}
			for _, h := range held {
				h.Release(ok)
			}
			if !drained(t, s, c) {
				t.Fatalf("counts %v after every release", mustCounts(t, s))
			}
		})
	}
}
