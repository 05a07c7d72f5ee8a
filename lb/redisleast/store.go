// Package redisleast is the global least-request policy's shared state:
// per pool, a Redis sorted set of replica → in-flight count that every
// Sluice instance reads and updates with atomic scripts (Photoroom's
// distributed least-request), plus what makes it safe to depend on: load
// shedding, reclaiming the requests of crashed instances, and a circuit
// breaker with a local fallback while Redis is unavailable. Optionally
// (QueueTimeout) requests that find no free slot wait in one global FIFO
// queue shared by every instance instead of being shed (queue.go).
package redisleast

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/tracker"
)

// Errors Select returns instead of a lease.
var (
	// ErrSaturated: even the least-loaded candidate has MaxInflight
	// requests in flight; answer 503 with Retry-After.
	// It is lb.ErrSaturated.
	ErrSaturated = lb.ErrSaturated
	// ErrNoCandidates: no candidate given, or none is a member of the
	// pool (errors.Is lb.ErrNoBackends).
	ErrNoCandidates = fmt.Errorf("no candidate replica is a member of the pool: %w", lb.ErrNoBackends)
)

// Store is one pool's shared state as seen by one instance. Safe for
// concurrent use.
type Store struct {
	// cfgp is the configuration in force: Configure swaps it whole; the
	// connection settings in it never change (see Config.ConnectionKey).
	cfgp   atomic.Pointer[Config]
	cfgMu  sync.Mutex    // serializes Configure
	reconf chan struct{} // Configure → loop: apply now
	pool   string
	k      keys
	// cl is the Redis client. Started without Redis (unreachable at New),
	// it is a placeholder until the probe connects and swaps in a real one
	// (provisional true until then). A read_timeout raised beyond what its
	// connection allows swaps in a new one too (fitConnection); opt is the
	// current client's options. connMu orders swaps and Close.
	cl          atomic.Pointer[clientRef]
	provisional atomic.Bool
	connMu      sync.Mutex
	opt         rueidis.ClientOption
	retired     map[rueidis.Client]bool // swapped out, closed after a grace period

	ident atomic.Pointer[identity]
	seq   atomic.Uint64
	br    breaker
	pend  pending
	batch batcher // least-request mode's picks and releases (batch.go)
	tombs tombstones
	local localCounts
	c     counters
	svc   ewma // hold time of successful leases, for RetryAfter
	// health is this instance's passive health of the replicas (failed
	// attempts mark one down); its in-flight counts serve only the
	// half-open probe (one request at a time to a replica whose down
	// time is over).
	health *tracker.Tracker

	// Queueing mode: the subscriber's own client, the waiting Selects.
	sub      rueidis.Client
	waiters  waiterSet
	rotated  chan struct{} // identity changed: resubscribe
	subReady chan struct{} // closed at the first subscription
	subOnce  sync.Once
	subErr   atomic.Pointer[error] // an error reply to SUBSCRIBE (NOPERM)
	qwg      sync.WaitGroup        // waiting Selects, for Close

	mu         sync.Mutex
	last       []string         // replicas of the last Sync, replayed after a Redis restart
	lastCounts map[string]int64 // global view of the last Counts or Sync

	unreachable atomic.Pointer[error] // why Redis was not usable at New
	syncErr     atomic.Pointer[error] // why the last set is not in Redis yet (nil: it is)
	syncMu      sync.Mutex            // serializes Sync and resync
	unsynced    atomic.Bool           // the last set has not reached Redis

	life    sync.Mutex // orders starting a probe against Close
	probing atomic.Bool
	closed  atomic.Bool
	done    chan struct{}
	wg      sync.WaitGroup
}

type clientRef struct{ rueidis.Client }

// rc is the current Redis client.
func (s *Store) rc() rueidis.Client { return s.cl.Load().Client }

// New connects to Redis and starts the instance's background loop (lease
// renewal, reaping dead instances, flushing pending releases).
//
// Redis that cannot be reached (refused, timed out, unknown host) does not
// fail New: a proxy restarted during a Redis outage must still serve. The
// store then starts with the breaker open — every Select served by the
// local fallback — and the probe connects when Redis answers; Unreachable
// reports the cause so the caller can log it. A Redis that answers with an
// error (wrong password, a user lacking a command, key or channel the
// store uses: see permScript) fails New: that is configuration.
func New(ctx context.Context, cfg Config, pool string) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opt, err := cfg.clientOption()
	if err != nil {
		return nil, err
	}
	s := &Store{opt: opt, pool: pool, k: newKeys(cfg.KeyPrefix, pool), done: make(chan struct{}),
		reconf: make(chan struct{}, 1)}
	s.cfgp.Store(&cfg)
	s.c.wait.bounds = waitBuckets
	s.br = breaker{limit: cfg.BreakerFailures, onOpen: s.startProbe}
	s.pend.max = cfg.PendingMax
	s.tombs.max = cfg.PendingMax
	s.health = tracker.New(cfg.healthConfig())
	s.ident.Store(s.newIdentity())
	s.batch.resetLocked(s.ident.Load())
	s.batch.cond.L = &s.batch.mu
	s.batch.kick = make(chan struct{}, 1)
	s.batch.sendFn = s.sendBatch
	client, err := s.connect(opt)
	if err != nil {
		return nil, err
	}
	s.cl.Store(&clientRef{client})
	if !s.provisional.Load() {
		err, what := s.renew(ctx), ""
		if err == nil {
			err, what = s.checkPermissions(ctx), "checking the user's permissions: "
		}
		if err != nil {
			if !transportErr(err) {
				client.Close()
				return nil, fmt.Errorf("redis %v: %s%w", cfg.Addrs, what, err)
			}
			s.unreachable.Store(&err)
		}
	}
	if s.queueing() {
		// The subscriber keeps a single-node client whatever happens: a
		// cluster delivers PUBLISH on every node, and this client
		// redials by itself when Redis comes back.
		sopt := opt
		sopt.ForceSingleClient = true
		sub, err := rueidis.NewClient(sopt)
		if sub == nil {
			client.Close()
			return nil, fmt.Errorf("redis %v: %w", cfg.Addrs, err)
		}
		s.sub, s.rotated, s.subReady = sub, make(chan struct{}, 1), make(chan struct{})
	}
	s.wg.Add(2)
	go s.loop()
	go s.flushBatches()
	if s.queueing() {
		s.wg.Add(1)
		go s.subscribe()
	}
	if s.Unreachable() != nil {
		s.br.forceOpen()
		s.startProbe()
	} else if s.queueing() {
		// Not fatal: a waiter told nothing still finds its slot (recheck at
		// subscription, cancel script at its deadline).
		t := time.NewTimer(cfg.DialTimeout)
		select {
		case <-s.subReady:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if p := s.subErr.Load(); p != nil {
			select {
			case <-s.subReady:
			default: // Redis refused the subscription: configuration
				s.Close()
				return nil, fmt.Errorf("redis %v: subscribing to %s: %w", cfg.Addrs, s.k.notify(s.InstanceID()), *p)
			}
		}
	}
	return s, nil
}

func (s *Store) newIdentity() *identity {
	id := redisconn.InstanceID(s.conf().InstanceID)
	return &identity{id: id, alive: s.k.alive(id), inst: s.k.inst(id)}
}

// InstanceID is the name this instance currently records requests under.
func (s *Store) InstanceID() string { return s.ident.Load().id }

// Pool is the pool's name.
func (s *Store) Pool() string { return s.pool }

// call bounds one Redis call by ReadTimeout, times it and feeds the breaker.
func (s *Store) call(ctx context.Context, fn func(context.Context) rueidis.RedisResult) rueidis.RedisResult {
	return s.callUntil(ctx, time.Now().Add(s.conf().ReadTimeout), fn)
}

// callUntil is call with an explicit deadline, for several tries sharing
// one ReadTimeout.
func (s *Store) callUntil(ctx context.Context, deadline time.Time, fn func(context.Context) rueidis.RedisResult) rueidis.RedisResult {
	cctx, cancel := context.WithDeadline(ctx, deadline)
	start := time.Now()
	res := fn(cctx)
	s.c.observe(time.Since(start))
	cancel()
	err := res.Error()
	if err != nil && ctx.Err() != nil {
		return res // the caller gave up: says nothing about Redis
	}
	if err != nil && !rueidis.IsRedisNil(err) {
		if _, isReply := rueidis.IsRedisErr(err); !isReply {
			s.c.errors.Add(1)
		}
	}
	s.br.record(err)
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

// Sync makes replicas the pool's member set in Redis: new replicas join at
// 0, removed ones leave, staying ones keep their counts. The list is also
// remembered and replayed if Redis comes back empty (restart).
//
// A set given while Redis cannot take it (breaker open, an error) is
// marked unsynced and applied as soon as Redis answers, whatever Redis
// still holds.
func (s *Store) Sync(ctx context.Context, replicas []string) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	replicas = slices.Clone(replicas)
	s.mu.Lock()
	s.last = replicas
	s.mu.Unlock()
	s.local.retain(replicas)
	s.health.SetReplicas(replicas)
	if s.br.isOpen() {
		err := fmt.Errorf("redis %v: circuit breaker open; will sync when it closes", s.conf().Addrs)
		s.unsynced.Store(true)
		s.syncErr.Store(&err)
		return err
	}
	return s.sync(ctx, replicas)
}

func (s *Store) sync(ctx context.Context, replicas []string) error {
	res := s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		if s.queueing() {
			args := append([]string{strconv.Itoa(s.conf().MaxInflight), s.k.tag}, replicas...)
			return syncQueueScript.Exec(ctx, s.rc(), []string{s.k.load, s.k.gone, s.k.queue}, args)
		}
		return syncScript.Exec(ctx, s.rc(), []string{s.k.load, s.k.gone}, replicas)
	})
	if err := res.Error(); err != nil {
		err = fmt.Errorf("redis sync: %w", err)
		s.unsynced.Store(true)
		s.syncErr.Store(&err)
		return err
	}
	s.unsynced.Store(false)
	s.syncErr.Store(nil)
	_, err := s.Counts(ctx)
	return err
}

// resync replays the last Sync when Redis holds no member (it restarted
// without persistence, or the key was deleted). True if it synced.
func (s *Store) resync(ctx context.Context) bool {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	if !s.unsynced.Load() {
		if len(last) == 0 {
			return false
		}
		res := s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
			return s.rc().Do(ctx, s.rc().B().Zcard().Key(s.k.load).Build())
		})
		if n, err := res.AsInt64(); err != nil || n > 0 {
			return false
		}
	}
	return s.sync(ctx, last) == nil
}

// Counts reads the global in-flight count of every member replica.
func (s *Store) Counts(ctx context.Context) (map[string]int64, error) {
	res := s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return s.rc().Do(ctx, s.rc().B().Zrange().Key(s.k.load).Min("0").Max("-1").Withscores().Build())
	})
	zs, err := res.AsZScores()
	if err != nil {
		return nil, fmt.Errorf("redis counts: %w", err)
	}
	out := make(map[string]int64, len(zs))
	for _, z := range zs {
		out[z.Member] = int64(z.Score)
	}
	s.mu.Lock()
	s.lastCounts = out
	s.mu.Unlock()
	return out, nil
}

// Stats snapshots the counters and state.
func (s *Store) Stats() Stats {
	cum, count, sum := s.c.histogram()
	wcum, wcount, wsum := s.c.wait.snapshot()
	s.mu.Lock()
	inflight := s.lastCounts
	s.mu.Unlock()
	return Stats{
		Selections: s.c.selections.Load(), Releases: s.c.releases.Load(),
		Fallbacks: s.c.fallbacks.Load(), ViewPicks: s.c.viewPicks.Load(), Shed: s.c.shed.Load(), Errors: s.c.errors.Load(),
		Reclaimed: s.c.reclaimed.Load(), Pending: s.pend.len() + s.batch.stuck(s.ident.Load(), s.br.isOpen()), Breaker: s.br.state(),
		Buckets: scriptBuckets, BucketCounts: cum, ScriptCount: count, ScriptSum: sum,
		InFlight: inflight,
		Queueing: s.queueing(), Queued: s.c.queueLen.Load(), Waiting: s.waiters.len(),
		QueuedTotal: s.c.queuedTotal.Load(), Handovers: s.c.handovers.Load(),
		QueueTimeouts: s.c.queueTimeouts.Load(), QueueCancels: s.c.queueCancels.Load(),
		WaitBuckets: waitBuckets, WaitBucketCounts: wcum, WaitCount: wcount, WaitSum: wsum,
	}
}

// Close stops the background loop, sends the releases still pending and
// deletes the liveness key, so whatever this instance still has recorded
// is reclaimed by the next reaper instead of after LeaseTTL. Leases
// released after Close only update the local counts.
func (s *Store) Close() {
	s.life.Lock()
	if !s.closed.CompareAndSwap(false, true) {
		s.life.Unlock()
		return
	}
	s.life.Unlock()
	close(s.done)
	s.qwg.Wait() // waiting Selects leave the queue (or keep their slot)
	s.wg.Wait()
	ctx := context.Background()
	if !s.br.isOpen() {
		s.drainBatches()
		s.flush(ctx)
		id := s.ident.Load()
		s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
			return s.rc().Do(ctx, s.rc().B().Del().Key(id.alive).Build())
		})
	}
	s.connMu.Lock()
	retired := s.retired
	s.retired = nil
	s.connMu.Unlock()
	for c := range retired {
		c.Close()
	}
	s.rc().Close()
}

// connect makes a Redis client. When Redis can't be reached it returns a
// placeholder instead — a single-node client that fails every call until
// the probe replaces it — marks the store provisional and records why.
func (s *Store) connect(opt rueidis.ClientOption) (rueidis.Client, error) {
	client, err := rueidis.NewClient(opt)
	if err == nil {
		return client, nil
	}
	if !transportErr(err) {
		return nil, fmt.Errorf("redis %v: %w", s.conf().Addrs, err)
	}
	single := opt
	single.ForceSingleClient = true
	placeholder, _ := rueidis.NewClient(single) // a client even though the dial failed
	if placeholder == nil {
		return nil, fmt.Errorf("redis %v: %w", s.conf().Addrs, err)
	}
	s.provisional.Store(true)
	s.unreachable.Store(&err)
	return placeholder, nil
}

// Unreachable is why Redis could not be used when the store started (nil
// if it could): the store then serves from the local fallback until the
// probe gets through.
func (s *Store) Unreachable() error {
	if p := s.unreachable.Load(); p != nil {
		return *p
	}
	return nil
}
