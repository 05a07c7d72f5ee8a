package redisleast

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
)

// Redis can answer a release with an error reply instead of dropping the
// connection: READONLY during a failover, NOREPLICAS, LOADING, BUSY,
// NOPERM. The release must be kept and sent again, like after a network
// error; it used to be dropped, leaving the replica's count +1 (and with
// max_inflight, shedding for good).
func TestReleaseAnsweredWithAnErrorReplyIsRetried(t *testing.T) {
	bothModes(t, testReleaseAnsweredWithAnErrorReplyIsRetried)
}

// bothModes runs a test in the plain and in the queueing mode (whose
// scripts differ): cfg makes the mode's config for an address.
func bothModes(t *testing.T, test func(t *testing.T, cfg func(addr string) Config)) {
	t.Run("plain", func(t *testing.T) { test(t, func(addr string) Config { return testConfig(t, addr) }) })
	oneCallModes(t, test)
}

// oneCallModes runs test in the modes with one Redis call per select and
// per release: the least-request mode without a call budget (call_rate
// unlimited), and the queueing mode.
func oneCallModes(t *testing.T, test func(t *testing.T, cfg func(addr string) Config)) {
	t.Run("exact", func(t *testing.T) { test(t, func(addr string) Config { return exactConfig(t, addr) }) })
	t.Run("queueing", func(t *testing.T) { test(t, func(addr string) Config { return queueConfig(t, addr) }) })
}

// exactConfig is the least-request mode with one call per select and per
// release, whatever the rate (call_rate unlimited).
func exactConfig(t testing.TB, addr string) Config {
	c := testConfig(t, addr)
	c.CallRate = -1
	return c
}

func testReleaseAnsweredWithAnErrorReplyIsRetried(t *testing.T, mode func(string) Config) {
	srv := privateRedis(t)
	cfg := mode(srv.Addr)
	cfg.LeaseTTL = 150 * time.Millisecond // the maintenance loop (and its flush) runs every 50 ms
	s := newStore(t, cfg, "errreply")
	s.SetReplicas([]string{"10.0.0.1:1"})
	ctx := context.Background()
	l, err := s.Pick(ctx, &lb.Request{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	setWrites := func(refuse bool) {
		n := "0"
		if refuse {
			n = "1" // this server has no replica: every write gets NOREPLICAS
		}
		if err := admin.Do(ctx, admin.B().ConfigSet().ParameterValue().ParameterValue("min-replicas-to-write", n).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	setWrites(true)
	l.Release(lb.Outcome{Kind: lb.Success})
	if c, _ := s.Counts(ctx); c["10.0.0.1:1"] != 1 {
		t.Fatalf("while writes are refused the count is %d, want still 1", c["10.0.0.1:1"])
	}
	setWrites(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := s.Counts(ctx)
		if err == nil && c["10.0.0.1:1"] == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the release answered with an error reply was never sent again: counts %v (%v)", c, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A backend set given while Redis is unreachable is applied when Redis
// answers again, also when Redis kept its keys (it used to be replayed
// only into an empty Redis, so the old set stayed and picks failed).
func TestBackendSetChangedWhileRedisWasAwayIsAppliedOnReturn(t *testing.T) {
	bothModes(t, testBackendSetChangedWhileRedisWasAwayIsAppliedOnReturn)
}

func testBackendSetChangedWhileRedisWasAwayIsAppliedOnReturn(t *testing.T, mode func(string) Config) {
	srv := privateRedis(t)
	cfg := mode(srv.Addr)
	cfg.ReadTimeout, cfg.BreakerBackoff = 200*time.Millisecond, 50*time.Millisecond
	s := newStore(t, cfg, "away")
	s.SetReplicas([]string{"10.0.0.1:1"})
	srv.Signal(syscall.SIGSTOP) // frozen: keys intact
	// The first pick times out and opens the breaker (its lease, if any,
	// is a local fallback).
	if l, err := s.Pick(context.Background(), &lb.Request{}); err == nil {
		l.Release(lb.Outcome{Kind: lb.Success})
	}
	waitFor(t, "the breaker to open", func() bool { return s.Stats().Breaker == Open })
	s.SetReplicas([]string{"10.0.0.2:1", "10.0.0.3:1"})
	if s.SyncErr() == nil {
		t.Fatal("SyncErr is nil for a set given while the breaker is open")
	}
	srv.Signal(syscall.SIGCONT)
	waitFor(t, "the breaker to close", func() bool { return s.Stats().Breaker == Closed })
	waitFor(t, "the new set in Redis", func() bool {
		c, err := s.Counts(context.Background())
		_, old := c["10.0.0.1:1"]
		_, b := c["10.0.0.2:1"]
		return err == nil && !old && b && len(c) == 2
	})
	if err := s.SyncErr(); err != nil {
		t.Fatalf("SyncErr once the set is in Redis: %v", err)
	}
	l, err := s.Pick(context.Background(), &lb.Request{})
	if err != nil || l.(*Lease).Fallback {
		t.Fatalf("pick after the return: %v (fallback %v)", err, l != nil && l.(*Lease).Fallback)
	}
	l.Release(lb.Outcome{Kind: lb.Success})
}
