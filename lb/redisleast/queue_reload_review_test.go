package redisleast

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// A reload that lowers queue_timeout (an operator's answer to requests
// waiting too long) reaches the requests already waiting, as
// queued_least_latency's does: they used to keep the deadline of the
// config they arrived under.
func TestConfigureQueueTimeoutReachesWaiters(t *testing.T) {
	redistest.Each(t, testConfigureQueueTimeoutReachesWaiters)
}

func testConfigureQueueTimeoutReachesWaiters(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	cfg.QueueTimeout, cfg.LeaseTTL = time.Hour, time.Hour
	s := newStore(t, cfg, "qt")
	s.SetReplicas([]string{"r"})
	held := sel(t, s, "r")
	defer held.Release(ok)
	out := make(chan got, 1)
	enqueue(t, context.Background(), c, s, "waiter", out, "r")

	cfg.QueueTimeout = time.Nanosecond // already past for the waiter
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	guard := time.NewTimer(20 * time.Second) // turns a hang into a failure; no timing asserted
	defer guard.Stop()
	select {
	case g := <-out:
		if !errors.Is(g.err, lb.ErrQueueTimeout) {
			t.Fatalf("waiter after queue_timeout 1h → 1ns: lease %+v, err %v; want a queue timeout", g.l, g.err)
		}
	case <-guard.C:
		t.Fatal("the waiter still waits 20s after queue_timeout went from 1h to 1ns: the old timeout is in force")
	}
	if st := s.Stats(); st.QueueTimeouts != 1 || st.Waiting != 0 {
		t.Fatalf("stats after the timeout: %+v", st)
	}
}

// A reload that shortens breaker_backoff during an outage reaches the
// probe already waiting out the old one: an operator lowering it to check
// Redis sooner got the old wait first (here an hour).
func TestConfigureBreakerBackoffReachesTheWaitingProbe(t *testing.T) {
	cfg := testConfig(t, testRedis(t))
	cfg.BreakerBackoff, cfg.LeaseTTL = time.Hour, time.Hour
	s := newStore(t, cfg, "backoff")
	s.br.forceOpen() // an outage: the probe waits breaker_backoff before its PING
	s.startProbe()
	cfg.BreakerBackoff = time.Nanosecond
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the probe to close the breaker after breaker_backoff 1h → 1ns", func() bool { return s.Stats().Breaker == Closed })
}
