package redisleast

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/tracker"
)

// member is this instance's presence in the pool's Redis records, the
// same whatever the mode: the connection, the identity its requests are
// recorded under (renewed while it lives; the reaper reclaims the records
// of instances that died), the pool's member set, the breaker and its
// probe, the releases kept while Redis is away, and the local counts that
// serve meanwhile. It never asks which mode runs: the mode's scripts for
// these records and its share of the background work come through rec,
// set once at New.
type member struct {
	// cfgp is the configuration in force: configure swaps it whole; the
	// connection settings in it never change (see Config.ConnectionKey).
	cfgp   atomic.Pointer[Config]
	cfgMu  sync.Mutex    // serializes configure
	wakeCh chan struct{} // → loop: run a round now (configure, records lost)
	pool   string
	k      keys
	conn   conn
	rec    records // the mode (Store.mode)
	// reconf is closed (and replaced) by each configure, so that what
	// waits on a setting (a queued Select's queue_timeout) follows it.
	reconf atomic.Pointer[chan struct{}]

	ident atomic.Pointer[identity]
	seq   atomic.Uint64
	own   ownRecords // what it holds in Redis, to rewrite after Redis lost writes
	br    breaker
	pend  pending
	tombs tombstones
	local localCounts
	set   memberSet // the pool's member set as this instance gives it (memberset.go)
	c     counters
	svc   ewma // hold time of successful leases, for RetryAfter
	// health is this instance's passive health of the replicas (failed
	// attempts mark one down); its in-flight counts serve the half-open
	// probe (one request at a time to a replica whose down time is over:
	// probe.go) and the health report (ReplicaHealth).
	health *tracker.Tracker

	unreachable atomic.Pointer[error] // why Redis was not usable at New

	mismatchLog // the logger, and when it last warned of differing sets (setmismatch.go)

	lifecycle // its goroutines, and closing (lifecycle.go)
}

func newMember(cfg Config, pool string) *member {
	m := &member{pool: pool, k: newKeys(cfg.KeyPrefix, pool), wakeCh: make(chan struct{}, 1),
		lifecycle: lifecycle{done: make(chan struct{})}}
	m.cfgp.Store(&cfg)
	reconf := make(chan struct{})
	m.reconf.Store(&reconf)
	m.br = breaker{limit: cfg.BreakerFailures, onOpen: m.startProbe}
	m.pend.max = cfg.PendingMax
	m.tombs.max = cfg.PendingMax
	m.health = tracker.New(cfg.healthConfig())
	m.ident.Store(m.newIdentity())
	return m
}

// open connects, renews the liveness key and checks the user's
// permissions. Redis that cannot be reached is not an error (see New):
// Unreachable reports it.
func (m *member) open(ctx context.Context, opt rueidis.ClientOption) error {
	addrs := m.conf().Addrs
	unreachable, err := m.conn.dial(opt, addrs)
	if err != nil {
		return err
	}
	if unreachable != nil {
		m.unreachable.Store(&unreachable)
		return nil
	}
	err, what := m.renew(ctx), ""
	if err == nil {
		err, what = m.checkPermissions(ctx), "checking the user's permissions: "
	}
	if err != nil {
		if !transportErr(err) {
			m.conn.close()
			return fmt.Errorf("redis %v: %s%w", addrs, what, err)
		}
		m.unreachable.Store(&err)
	}
	return nil
}

// start runs the maintenance loop, and the probe at once when Redis was
// unreachable at open (the breaker starts open).
func (m *member) start() {
	m.wg.Add(1)
	go m.loop()
	if m.unreachableErr() != nil {
		m.br.forceOpen()
		m.startProbe()
	}
}

func (m *member) unreachableErr() error {
	if p := m.unreachable.Load(); p != nil {
		return *p
	}
	return nil
}

// conf is the configuration in force.
func (m *member) conf() Config { return *m.cfgp.Load() }

// confChanged is closed by the next configure. Take it before reading
// conf, so that no change between the two is missed.
func (m *member) confChanged() <-chan struct{} { return *m.reconf.Load() }

// configure applies cfg's live settings (see Store.Configure).
func (m *member) configure(cfg Config) error {
	m.cfgMu.Lock()
	defer m.cfgMu.Unlock()
	if f := m.conf().connectionChange(cfg); f != "" {
		if f == "queue_timeout" {
			return errors.New("queue_timeout: switching the queueing mode on or off (0 ↔ > 0) needs a new store")
		}
		return fmt.Errorf("%s: a changed %s needs a new store (new connection or identity)", f, f)
	}
	m.cfgp.Store(&cfg)
	next := make(chan struct{})
	close(*m.reconf.Swap(&next)) // after the store: a waiter woken reads the new cfg
	m.br.setLimit(cfg.BreakerFailures)
	m.pend.setMax(cfg.PendingMax)
	m.health.Configure(cfg.healthConfig())
	// The loop renews with the new lease TTL, moves its ticker, redials
	// if the read timeout outgrew the connection, and lets the mode act
	// (the queue hands slots a raised max_inflight freed to the waiters).
	m.wake()
	return nil
}

// wake makes the loop run a round now.
func (m *member) wake() {
	select {
	case m.wakeCh <- struct{}{}:
	default:
	}
}

// identity is the name under which an instance records its requests.
type identity struct {
	id, alive, inst string
	acked           atomic.Int64 // the highest version of its records Redis acknowledged (reconcile.go)
}

func (m *member) newIdentity() *identity {
	id := redisconn.InstanceID(m.conf().InstanceID)
	return &identity{id: id, alive: m.k.alive(id), inst: m.k.inst(id)}
}

// rotate abandons ident (if still current) for a fresh identity.
func (m *member) rotate(old *identity) {
	if m.ident.CompareAndSwap(old, m.newIdentity()) {
		m.pend.clear()
		m.rec.rotated()
	}
}

// rc is the current Redis client.
func (m *member) rc() rueidis.Client { return m.conn.rc() }

// connWriteTimeout is the current client's connection-level deadline.
func (m *member) connWriteTimeout() time.Duration { return m.conn.writeTimeout() }

// call bounds one Redis call by ReadTimeout, times it and feeds the breaker.
func (m *member) call(ctx context.Context, fn func(context.Context) rueidis.RedisResult) rueidis.RedisResult {
	return m.callUntil(ctx, time.Now().Add(m.conf().ReadTimeout), fn)
}

// callUntil is call with an explicit deadline, for several tries sharing
// one ReadTimeout.
func (m *member) callUntil(ctx context.Context, deadline time.Time, fn func(context.Context) rueidis.RedisResult) rueidis.RedisResult {
	cctx, cancel := context.WithDeadline(ctx, deadline)
	start := time.Now()
	res := fn(cctx)
	m.c.observe(time.Since(start))
	cancel()
	err := res.Error()
	if err != nil && ctx.Err() != nil {
		return res // the caller gave up: says nothing about Redis
	}
	if err != nil && !rueidis.IsRedisNil(err) {
		if _, isReply := rueidis.IsRedisErr(err); !isReply {
			m.c.errors.Add(1)
		}
	}
	m.br.record(err)
	return res
}

// transportErr is true when err leaves unknown whether a command ran.
func transportErr(err error) bool {
	if err == nil || rueidis.IsRedisNil(err) {
		return false
	}
	_, isReply := rueidis.IsRedisErr(err)
	return !isReply
}

// execRelease sends releases (request ids, "?id" for lost selects)
// recorded under ident, with the mode's script.
func (m *member) execRelease(ctx context.Context, ident *identity, ids []string) error {
	floor := ident.acked.Load()
	v, err := m.call(ctx, func(ctx context.Context) rueidis.RedisResult { return m.rec.execRelease(ctx, ident, ids) }).AsInt64()
	if err != nil {
		return err
	}
	m.noteVersion(ident, floor, v)
	return nil
}

// releaseNow releases one request recorded in Redis, or keeps it for the
// maintenance loop: on any failure — a network error, or an error reply
// (READONLY in a failover, NOREPLICAS, LOADING, BUSY, NOPERM) — since
// dropping it would leave the count +1.
func (m *member) releaseNow(ident *identity, req string) {
	if m.br.isOpen() {
		m.queueRelease(ident, req)
		return
	}
	if err := m.execRelease(context.Background(), ident, []string{req}); err != nil && !rueidis.IsRedisNil(err) {
		m.queueRelease(ident, req)
	}
}

// queueRelease keeps a release for later; on overflow the instance
// rotates its identity (see pending).
func (m *member) queueRelease(ident *identity, req string) {
	if m.pend.add(ident, req) {
		return
	}
	m.rotate(ident)
}

// stats is the mode-free part of Store.Stats.
func (m *member) stats() Stats {
	cum, count, sum := m.c.histogram()
	return Stats{
		Selections: m.c.selections.Load(), Releases: m.c.releases.Load(),
		Fallbacks: m.c.fallbacks.Load(), Mismatches: m.c.mismatches.Load(), ViewPicks: m.c.viewPicks.Load(), Shed: m.c.shed.Load(), Errors: m.c.errors.Load(),
		Reclaimed: m.c.reclaimed.Load(), Pending: m.pend.len(), Breaker: m.br.state(),
		Buckets: scriptBuckets, BucketCounts: cum, ScriptCount: count, ScriptSum: sum,
		InFlight: m.set.lastCounts(),
	}
}

// close waits for the goroutines, sends what is pending and deletes the
// liveness key (see Store.Close), then closes the connection.
func (m *member) close() {
	m.wg.Wait()
	ctx := context.Background()
	if !m.br.isOpen() {
		m.rec.drain()
		m.flush(ctx)
		id := m.ident.Load()
		m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
			return m.rc().Do(ctx, m.rc().B().Del().Key(id.alive).Build())
		})
	}
	m.conn.close()
}
