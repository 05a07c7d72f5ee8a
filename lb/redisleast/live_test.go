package redisleast

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

func TestErrorsAreTheLbErrors(t *testing.T) {
	for _, c := range []struct {
		err, is error
	}{
		{ErrSaturated, lb.ErrSaturated},
		{ErrQueueTimeout, lb.ErrQueueTimeout},
		{ErrNoCandidates, lb.ErrNoBackends},
	} {
		if !errors.Is(c.err, c.is) {
			t.Errorf("errors.Is(%v, %v) = false", c.err, c.is)
		}
	}
}

// Pick's refusals: no replica at all, none left after Unavailable and
// Avoid, and a closed store — for new requests and for those still
// waiting in the global queue when Close runs (they used to be served
// from the local counts of a store that is gone).
func TestPickRefusals(t *testing.T) { redistest.Each(t, testPickRefusals) }

func testPickRefusals(t *testing.T, tg redistest.Target) {
	ctx := context.Background()
	s := newStore(t, confFor(t, tg), "refusals")
	if _, err := s.Pick(ctx, &lb.Request{}); !errors.Is(err, lb.ErrNoBackends) {
		t.Fatalf("no replicas: %v, want lb.ErrNoBackends", err)
	}
	s.SetReplicas([]string{"a", "b"})
	if _, err := s.Pick(ctx, &lb.Request{Unavailable: []string{"a"}, Avoid: []string{"b"}}); !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("every replica unavailable: %v, want lb.ErrAllDown", err)
	}
	l, err := s.Pick(ctx, &lb.Request{Unavailable: []string{"a"}})
	if err != nil || l.Replica() != "b" {
		t.Fatalf("pick with a unavailable: %v %v", l, err)
	}
	s.Close()
	if _, err := s.Pick(ctx, &lb.Request{}); !errors.Is(err, lb.ErrShutdown) {
		t.Fatalf("Pick after Close: %v, want lb.ErrShutdown", err)
	}
	if _, err := s.Select(ctx, []string{"a"}); !errors.Is(err, lb.ErrShutdown) {
		t.Fatalf("Select after Close: %v, want lb.ErrShutdown", err)
	}
	if !l.Release(ok) {
		t.Fatal("a lease released after Close must still count once")
	}
	if n := s.InFlight()["b"]; n != 0 {
		t.Fatalf("in flight on b after the release: %d", n)
	}

	// A waiter in the global queue when the store closes.
	c := rawFor(t, tg)
	q := newStore(t, queueConfFor(t, tg), "refusals-q")
	q.SetReplicas([]string{"r"})
	held := sel(t, q, "r")
	out := make(chan got, 1)
	enqueue(t, ctx, c, q, "waiter", out, "r")
	go q.Close()
	g := <-out
	if !errors.Is(g.err, lb.ErrShutdown) || g.l != nil {
		t.Fatalf("waiter at Close: lease %v, err %v; want lb.ErrShutdown", g.l, g.err)
	}
	held.Release(ok)
	if !queueEmpty(t, q, c) {
		t.Fatal("the waiter refused at Close is still queued")
	}
}

func TestConnectionKeyAndConfigureRefusals(t *testing.T) {
	base := Config{Config: redisconn.Config{Addrs: []string{"127.0.0.1:6379"}}, InstanceID: "i", MaxInflight: 4}
	key := base.ConnectionKey()
	if key != base.WithDefaults().ConnectionKey() {
		t.Fatal("the key must not depend on whether defaults were applied")
	}
	needNew := map[string]func(*Config){
		"redis":         func(c *Config) { c.Addrs = []string{"127.0.0.1:6380"} },
		"username":      func(c *Config) { c.Username = "u" },
		"password":      func(c *Config) { c.Password = "hunter2" },
		"db":            func(c *Config) { c.DB = 1 },
		"tls":           func(c *Config) { c.TLS = true },
		"ca_file":       func(c *Config) { c.TLS, c.CAFile = true, "/ca.pem" },
		"dial_timeout":  func(c *Config) { c.DialTimeout = 3 * time.Second },
		"key_prefix":    func(c *Config) { c.KeyPrefix = "x" },
		"instance_id":   func(c *Config) { c.InstanceID = "j" },
		"queue_timeout": func(c *Config) { c.QueueTimeout = time.Second },
	}
	for field, mut := range needNew {
		c := base
		mut(&c)
		k := c.ConnectionKey()
		if k == key {
			t.Errorf("%s: same connection key", field)
		}
		if strings.Contains(k, "hunter2") {
			t.Errorf("the key holds the password: %s", k)
		}
		want := field
		if field == "ca_file" {
			want = "tls" // the first of the two that differs
		}
		if got := base.connectionChange(c); got != want {
			t.Errorf("%s: connectionChange names %q", field, got)
		}
	}
	live := map[string]func(*Config){
		"max_inflight":     func(c *Config) { c.MaxInflight = 9 },
		"lease_ttl":        func(c *Config) { c.LeaseTTL = time.Minute },
		"breaker_failures": func(c *Config) { c.BreakerFailures = 9 },
		"breaker_backoff":  func(c *Config) { c.BreakerBackoff = time.Minute },
		"read_timeout":     func(c *Config) { c.ReadTimeout = time.Second },
		"pending_max":      func(c *Config) { c.PendingMax = 9 },
	}
	for field, mut := range live {
		c := base
		mut(&c)
		if c.ConnectionKey() != key {
			t.Errorf("%s is live but changes the connection key", field)
		}
	}
	q1, q2 := base, base
	q1.QueueTimeout, q2.QueueTimeout = time.Second, time.Minute
	if q1.ConnectionKey() != q2.ConnectionKey() {
		t.Error("queue_timeout within the queueing mode changes the connection key")
	}
	// Values run together when joined plainly: these two used to share a key.
	a, b := base, base
	a.KeyPrefix, a.InstanceID = "p|q", "r"
	b.KeyPrefix, b.InstanceID = "p", "q|r"
	if a.ConnectionKey() == b.ConnectionKey() {
		t.Fatalf("different key_prefix/instance_id share the key %s", a.ConnectionKey())
	}

	// Configure on a store refuses every one of them, naming it.
	cfg := testConfig(t, testRedis(t))
	s := newStore(t, cfg, "refuse")
	for field, mut := range needNew {
		c := s.Config()
		mut(&c)
		if field == "redis" {
			c.Addrs = []string{"127.0.0.1:1"}
		}
		if field == "ca_file" {
			continue // Validate reads the file first
		}
		err := s.Configure(c)
		if err == nil || !strings.HasPrefix(err.Error(), field) {
			t.Errorf("Configure with a new %s: %v, want an error naming it", field, err)
		}
	}
	c := s.Config()
	c.KeyPrefix, c.InstanceID = c.KeyPrefix+"|x", "t"
	if err := s.Configure(c); err == nil {
		t.Fatal("Configure accepted a changed key_prefix")
	}
	if s.Config().KeyPrefix != cfg.KeyPrefix {
		t.Fatal("a refused Configure changed the settings")
	}
}

// Every live setting lands in the store's machinery, not just in Config.
func TestConfigureAppliesEveryLiveSetting(t *testing.T) {
	s := newStore(t, testConfig(t, testRedis(t)), "every")
	c := s.Config()
	c.MaxInflight, c.LeaseTTL, c.BreakerFailures, c.BreakerBackoff = 7, 9*time.Second, 5, 3*time.Second
	c.ReadTimeout, c.PendingMax = 400*time.Millisecond, 11
	if err := s.Configure(c); err != nil {
		t.Fatal(err)
	}
	got := s.Config()
	if got.MaxInflight != 7 || got.LeaseTTL != 9*time.Second || got.BreakerFailures != 5 ||
		got.BreakerBackoff != 3*time.Second || got.ReadTimeout != 400*time.Millisecond || got.PendingMax != 11 {
		t.Fatalf("Config() after Configure: %+v", got)
	}
	s.br.mu.Lock()
	limit := s.br.limit
	s.br.mu.Unlock()
	s.pend.mu.Lock()
	pmax := s.pend.max
	s.pend.mu.Unlock()
	if limit != 5 || pmax != 11 || s.reapInterval() != 3*time.Second {
		t.Fatalf("breaker limit %d, pending max %d, reap interval %v", limit, pmax, s.reapInterval())
	}
	bad := c
	bad.LeaseTTL = time.Millisecond
	if err := s.Configure(bad); err == nil || !strings.HasPrefix(err.Error(), "lease_ttl") {
		t.Fatalf("invalid lease_ttl: %v", err)
	}
	if s.Config().LeaseTTL != 9*time.Second {
		t.Fatal("an invalid Configure changed the settings")
	}
}

// pttl is the remaining TTL of this instance's liveness key.
func pttl(t *testing.T, c rueidis.Client, s *Store) time.Duration {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Pttl().Key(s.ident.Load().alive).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(n) * time.Millisecond
}

// A lease TTL change is renewed with at once, both ways: shortened from
// an hour it used to wait for the old 20-minute renewal tick.
func TestConfigureLeaseTTLTakesEffectAtOnce(t *testing.T) {
	redistest.Each(t, testConfigureLeaseTTLTakesEffectAtOnce)
}

func testConfigureLeaseTTLTakesEffectAtOnce(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := confFor(t, tg)
	cfg.LeaseTTL = 300 * time.Millisecond
	s := newStore(t, cfg, "ttl")
	if d := pttl(t, c, s); d > cfg.LeaseTTL {
		t.Fatalf("liveness key TTL %v with lease_ttl %v", d, cfg.LeaseTTL)
	}
	cfg.LeaseTTL = time.Hour
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the liveness key renewed with the hour", func() bool { return pttl(t, c, s) > time.Minute })
	cfg.LeaseTTL = 300 * time.Millisecond
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the liveness key renewed with 300ms", func() bool { d := pttl(t, c, s); return d > 0 && d <= cfg.LeaseTTL })
	// And the store keeps renewing at the new pace: its key never lapses
	// while it selects.
	s.SetReplicas([]string{"a"})
	for range 3 {
		sel(t, s, "a").Release(ok)
	}
	wantCounts(t, s, map[string]int64{"a": 0})
}

// In queueing mode a raised max_inflight hands the new slots to the
// waiters at once (it used to wait for a release or the loop's next
// kick, LeaseTTL/3 later).
func TestConfigureMaxInflightHandsNewSlotsToWaiters(t *testing.T) {
	redistest.Each(t, testConfigureMaxInflightHandsNewSlotsToWaiters)
}

func testConfigureMaxInflightHandsNewSlotsToWaiters(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	cfg.LeaseTTL = time.Hour // no kick from the loop's own tick
	s := newStore(t, cfg, "raise")
	s.SetReplicas([]string{"r"})
	held := sel(t, s, "r")
	out := make(chan got, 1)
	enqueue(t, context.Background(), c, s, "waiter", out, "r")
	cfg.MaxInflight = 2
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	g := <-out
	if g.err != nil || g.l.Fallback || g.l.Addr != "r" {
		t.Fatalf("waiter after max_inflight 1 → 2: %v %+v", g.err, g.l)
	}
	wantCounts(t, s, map[string]int64{"r": 2})
	// Three would be over the new limit: the next one waits again.
	out2 := make(chan got, 1)
	enqueue(t, context.Background(), c, s, "third", out2, "r")
	held.Release(ok)
	g2 := <-out2
	if g2.err != nil {
		t.Fatal(g2.err)
	}
	g.l.Release(ok)
	g2.l.Release(ok)
	if !drained(t, s, c) || !queueEmpty(t, s, c) {
		t.Fatal("records left")
	}

	// Lowering works the same way: back to 1, a second select waits.
	cfg.MaxInflight = 1
	cfg.QueueTimeout = 200 * time.Millisecond // live within the mode
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	one := sel(t, s, "r")
	if _, err := s.Select(context.Background(), []string{"r"}); !errors.Is(err, lb.ErrQueueTimeout) {
		t.Fatalf("second select at max_inflight 1, queue_timeout 200ms: %v, want a queue timeout", err)
	}
	one.Release(ok)
}

// read_timeout raised beyond what the connection allows: rueidis drops a
// connection whose reply takes longer than its ConnWriteTimeout (fixed
// per client at max(4×read_timeout, 1s)), so a raise from 250ms to 10s
// used to be capped at about 1s. Redis paused for 2s (CLIENT PAUSE) must
// now answer the select.
func TestConfigureReadTimeoutBeyondTheConnectionsDeadline(t *testing.T) {
	srv := privateRedis(t)
	cfg := testConfig(t, srv.Addr)
	cfg.ReadTimeout, cfg.LeaseTTL = 250*time.Millisecond, time.Hour
	s := newStore(t, cfg, "slow")
	s.SetReplicas([]string{"a"})
	before := s.InstanceID()
	cfg.ReadTimeout = 10 * time.Second
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the store to redial with a longer connection deadline", func() bool {
		return s.connWriteTimeout() >= 4*cfg.ReadTimeout
	})
	if s.InstanceID() != before {
		t.Fatal("the redial changed the identity")
	}
	admin := raw(t, srv.Addr)
	if err := admin.Do(context.Background(), admin.B().ClientPause().Timeout(2000).All().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	l, err := s.Select(context.Background(), []string{"a"})
	if err != nil || l.Fallback {
		t.Fatalf("select while Redis pauses 2s with read_timeout 10s: %v (fallback %v)", err, l != nil && l.Fallback)
	}
	l.Release(ok)
	wantCounts(t, s, map[string]int64{"a": 0})
	if st := s.Stats(); st.Breaker != Closed || st.Pending != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// RetryAfter: a second with nothing measured, then the mean hold time of
// successful leases; failures and cancellations do not count.
func TestRetryAfterFollowsTheHoldTime(t *testing.T) {
	cfg := testConfig(t, testRedis(t))
	cfg.MaxFails = 10 // the failure below must not take "a" down (passive health)
	s := newStore(t, cfg, "retry")
	if d := s.RetryAfter(); d != time.Second {
		t.Fatalf("RetryAfter with no sample: %v, want 1s", d)
	}
	s.SetReplicas([]string{"a"})
	l := sel(t, s, "a")
	l.start = l.start.Add(-5 * time.Second) // as if held 5s
	l.Release(ok)
	if d := s.RetryAfter(); d < 5*time.Second || d > time.Minute {
		t.Fatalf("RetryAfter after one 5s lease: %v", d)
	}
	for _, kind := range []lb.OutcomeKind{lb.Failure, lb.Cancelled} {
		l := sel(t, s, "a")
		l.start = l.start.Add(-time.Hour)
		l.Release(lb.Outcome{Kind: kind})
	}
	if d := s.RetryAfter(); d > time.Minute {
		t.Fatalf("failed or cancelled leases moved RetryAfter to %v", d)
	}
	var e ewma
	e.observe(10 * time.Second)
	for range 100 {
		e.observe(2 * time.Second)
	}
	if d := e.get(); d < 2*time.Second || d > 2100*time.Millisecond {
		t.Fatalf("ewma after 100 samples of 2s: %v", d)
	}
}

// Releases the flush sends (after an outage) that Redis answers with an
// error reply stay pending: here the ACL user loses EVAL/EVALSHA while
// SET (the renewal) still works, so the loop reaches its flush. They used
// to be dropped there, the count +1 for good. Batched (the default): the
// batch stays and goes again.
func TestFlushAnsweredWithAnErrorReplyKeepsTheReleases(t *testing.T) {
	t.Run("batched", func(t *testing.T) { testFlushAnsweredWithAnErrorReplyKeepsTheReleases(t, 0) })
	t.Run("exact", func(t *testing.T) { testFlushAnsweredWithAnErrorReplyKeepsTheReleases(t, -1) })
}

func testFlushAnsweredWithAnErrorReplyKeepsTheReleases(t *testing.T, callRate int) {
	srv := privateRedis(t)
	admin := raw(t, srv.Addr)
	ctx := context.Background()
	acl := func(rules ...string) {
		t.Helper()
		if err := admin.Do(ctx, admin.B().AclSetuser().Username("sluice").Rule(rules...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	acl("on", ">pw", "~*", "&*", "+@all")
	cfg := testConfig(t, srv.Addr)
	cfg.Username, cfg.Password = "sluice", "pw"
	cfg.BreakerBackoff = time.Hour // the test closes the breaker itself
	cfg.LeaseTTL = 150 * time.Millisecond
	cfg.CallRate = callRate
	s := newStore(t, cfg, "flush")
	s.SetReplicas([]string{"a"})
	l := sel(t, s, "a")
	s.br.record(context.DeadlineExceeded) // as if Redis had timed out
	l.Release(ok)
	if p := s.Stats().Pending; p != 1 {
		t.Fatalf("pending %d with the breaker open, want 1", p)
	}
	acl("-eval", "-evalsha")
	s.br.close()
	s.flush(ctx) // what the loop and the probe do once Redis answers
	s.mode.drain()
	if p := s.Stats().Pending; p != 1 {
		t.Fatalf("after a flush answered NOPERM: pending %d, want the release kept", p)
	}
	if c := mustCounts(t, s); c["a"] != 1 {
		t.Fatalf("count %v while scripts are refused", c)
	}
	acl("+eval", "+evalsha")
	waitFor(t, "the kept release to reach Redis", func() bool {
		return s.Stats().Pending == 0 && mustCounts(t, s)["a"] == 0
	})
}
