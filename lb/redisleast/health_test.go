package redisleast

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

var failed = lb.Outcome{Kind: lb.Failure, Status: 502}

// A replica whose attempts fail (transport error or 5xx) is marked down by
// this instance after max_fails of them and is not picked while down: in
// the plain mode, and in the queueing mode, where a queued request is not
// handed the down replica's free slot but waits for a healthy one. Before,
// the store had no passive health: a dead replica, always the least
// loaded (its requests fail at once), kept getting its share.
func TestFailedReplicaIsSkippedWhileDown(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		bothModes(t, func(t *testing.T, mode func(string) Config) { testFailedReplicaIsSkippedWhileDown(t, tg, mode) })
	})
}

func testFailedReplicaIsSkippedWhileDown(t *testing.T, tg redistest.Target, mode func(string) Config) {
	cfg := mode(tg.Conn.Addrs[0])
	cfg.Addrs = tg.Conn.Addrs
	cfg.MaxFails, cfg.FailDuration = 2, time.Hour
	s := newStore(t, cfg, "health")
	dead, live := "10.0.0.1:1", "10.0.0.2:1"
	s.SetReplicas([]string{dead, live})
	ctx := context.Background()

	sel(t, s, dead).Release(failed)
	// One failure of two: still a candidate.
	sel(t, s, dead).Release(failed)
	if l, err := s.Select(ctx, []string{dead}); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("Select of the down replica alone: %v %v, want lb.ErrAllDown", l, err)
	}
	for i := 0; i < 20; i++ {
		l, err := s.Pick(ctx, &lb.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Replica() != live {
			t.Fatalf("pick %d went to the down replica", i)
		}
		l.Release(ok)
	}
	if _, err := s.Pick(ctx, &lb.Request{Unavailable: []string{live}}); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("every candidate down or unavailable: %v, want lb.ErrAllDown", err)
	}

	if s.Stats().Queueing {
		// The live replica's only slot is taken; the down one's is free.
		// The next request queues (the script would have handed it the
		// free slot at once, and never queued it, if it could take it)
		// and gets the live replica when it frees.
		c := rawFor(t, tg)
		held := sel(t, s, live)
		out := make(chan got, 1)
		enqueue(t, ctx, c, s, "waiter", out, dead, live)
		held.Release(ok)
		g := <-out
		if g.err != nil || g.l.Addr != live {
			t.Fatalf("queued request: %+v, want a slot on %s", g, live)
		}
		g.l.Release(ok)
		waitFor(t, "the queue to empty", func() bool { return queueEmpty(t, s, c) && hlen(t, c, s.k.cands) == 0 })
	}
	// Releases of batched leases reach Redis with the next batch, not at
	// once (CI read live at 1 right after the last one).
	waitFor(t, "every count back to 0", func() bool {
		n := mustCounts(t, s)
		return n[dead] == 0 && n[live] == 0
	})
}

// After the down time, one request at a time probes the replica: a success
// brings it back, a failure takes it down again (for twice as long).
func TestDownReplicaIsProbedAfterItsDownTime(t *testing.T) {
	cfg := testConfig(t, testRedis(t))
	cfg.FailDuration = 20 * time.Millisecond
	s := newStore(t, cfg, "probe")
	s.SetReplicas([]string{"a", "b"})
	ctx := context.Background()
	sel(t, s, "a").Release(failed)
	var probe *Lease
	waitFor(t, "the down time to pass", func() bool {
		l, err := s.Select(ctx, []string{"a"})
		if err != nil && !errors.Is(err, lb.ErrAllDown) {
			t.Fatal(err)
		}
		probe = l
		return err == nil
	})
	if _, err := s.Select(ctx, []string{"a"}); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("a second request while the probe is in flight: %v, want lb.ErrAllDown", err)
	}
	probe.Release(ok)
	sel(t, s, "a").Release(ok)
	sel(t, s, "a").Release(ok)
}

// max_fails and fail_duration are validated by name and apply live.
func TestPassiveHealthSettings(t *testing.T) {
	cfg := testConfig(t, testRedis(t)).WithDefaults()
	if cfg.MaxFails != 1 || cfg.FailDuration != 5*time.Second {
		t.Fatalf("defaults: max_fails %d, fail_duration %v; want 1 and 5s (as queued_least_latency)", cfg.MaxFails, cfg.FailDuration)
	}
	badFails, badDuration := cfg, cfg
	badFails.MaxFails, badDuration.FailDuration = -1, -time.Second
	if err := badFails.Validate(); err == nil || !strings.Contains(err.Error(), "max_fails") {
		t.Fatalf("max_fails -1: %v", err)
	}
	if err := badDuration.Validate(); err == nil || !strings.Contains(err.Error(), "fail_duration") {
		t.Fatalf("fail_duration -1s: %v", err)
	}
	s := newStore(t, cfg, "healthcfg")
	s.SetReplicas([]string{"a", "b"})
	cfg.MaxFails = 3
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	sel(t, s, "a").Release(failed)
	sel(t, s, "a").Release(failed)
	sel(t, s, "a").Release(failed)
	if _, err := s.Select(context.Background(), []string{"a"}); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("after 3 failures at max_fails 3: %v, want lb.ErrAllDown", err)
	}
}
