package redisleast

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// A replica whose down time is over takes one request at a time, its
// probe, until one succeeds. The picks that found it up before the first
// of them was counted (the Redis round trip lies between the check and
// the count) all went to it: with Redis frozen until every pick has
// passed the check, each one that Redis sent there was another probe.
func TestRecoveringReplicaGetsOneProbeAtATime(t *testing.T) {
	bothModes(t, testRecoveringReplicaGetsOneProbeAtATime)
}

func testRecoveringReplicaGetsOneProbeAtATime(t *testing.T, mode func(string) Config) {
	const picks = 8
	srv := privateRedis(t)
	cfg := mode(srv.Addr)
	cfg.FailDuration = time.Millisecond
	if cfg.MaxInflight > 0 {
		cfg.MaxInflight = picks // queueing: a slot for every pick, none waits
	}
	s := newStore(t, cfg, "probe-race")
	s.SetReplicas([]string{"a", "b"})
	ctx := context.Background()
	sel(t, s, "a").Release(failed)
	waitFor(t, "a's down time to pass", func() bool { return !s.health.Down("a") })

	// Frozen, Redis answers no pick before every one has passed the
	// health check (a pick numbers its request after it).
	srv.Signal(syscall.SIGSTOP)
	thawed := false
	defer func() {
		if !thawed {
			srv.Signal(syscall.SIGCONT)
		}
	}()
	base := s.seq.Load()
	out := make(chan got, picks)
	for range picks {
		go func() {
			l, err := s.Pick(ctx, &lb.Request{})
			lease, _ := l.(*Lease)
			out <- got{l: lease, err: err}
		}()
	}
	waitFor(t, "every pick to reach Redis", func() bool { return s.seq.Load() >= base+picks })
	srv.Signal(syscall.SIGCONT)
	thawed = true

	onA := 0
	var leases []*Lease
	for range picks {
		g := <-out
		if g.err != nil {
			t.Errorf("pick: %v", g.err)
			continue
		}
		leases = append(leases, g.l)
		if g.l.Addr == "a" {
			onA++
		}
	}
	// Every lease is held until here: the first one on a is its probe.
	for _, l := range leases {
		l.Release(ok)
	}
	if onA != 1 {
		t.Fatalf("%d of %d concurrent picks went to a, whose down time had just ended, while its probe was in flight; want 1", onA, picks)
	}
	waitFor(t, "every count back to 0", func() bool {
		n := mustCounts(t, s)
		return n["a"] == 0 && n["b"] == 0
	})
}

// The queue hands freed slots out in Redis, which knows nothing of an
// instance's passive health: x's two waiters, handed both slots of a
// (freed by y) after x's down time for it ended, both went to it.
func TestQueuedRequestsGetOneProbeAtATime(t *testing.T) {
	cfg := queueConfig(t, testRedis(t))
	cfg.MaxInflight = 2
	cfg.FailDuration = time.Millisecond
	st := queueStores(t, cfg, "x", "y")
	x, y := st[0], st[1]
	x.SetReplicas([]string{"a"})
	y.SetReplicas([]string{"a"})
	ctx := context.Background()
	sel(t, x, "a").Release(failed)
	waitFor(t, "a's down time to pass", func() bool { return !x.health.Down("a") })

	c := raw(t, testRedis(t))
	h1, h2 := sel(t, y, "a"), sel(t, y, "a")
	out := make(chan got, 2)
	enqueue(t, ctx, c, x, "w1", out, "a")
	enqueue(t, ctx, c, x, "w2", out, "a")
	h1.Release(ok)
	probe := <-out
	if probe.err != nil || probe.l.Addr != "a" {
		t.Fatalf("the first waiter: %+v, want a slot on a (its probe)", probe)
	}
	h2.Release(ok)
	second := <-out
	if second.err == nil {
		second.l.Release(ok)
		t.Fatalf("x's second waiter was handed a too (%s) while x's probe of a was in flight; want it refused", second.l.Addr)
	}
	if !errors.Is(second.err, lb.ErrAllDown) {
		t.Fatalf("the second waiter: %v, want lb.ErrAllDown (its one candidate takes a probe at a time)", second.err)
	}
	probe.l.Release(ok)
	waitFor(t, "the queue to empty and a's count back to 0", func() bool {
		return queueEmpty(t, x, c) && hlen(t, c, x.k.cands) == 0 && mustCounts(t, x)["a"] == 0
	})
}
