package redisleast

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// loop runs every LeaseTTL/3 while the breaker is closed, and at once
// after Configure: renew this instance's liveness key, send pending
// releases, replay a set Redis did not take, reap dead instances, let the
// mode do its share (the queue releases its orphaned records and
// dispatches free slots to waiters) and refresh the global counts the metrics report; and redial if
// read_timeout outgrew the connection.
//
// Reclaim bound: an instance that dies renewed its key at most LeaseTTL/3
// before; the key expires LeaseTTL after that renewal, and some live
// instance reaps within one more LeaseTTL/3. So a dead instance's requests
// stop counting at most LeaseTTL + LeaseTTL/3 after it died.
func (m *member) loop() {
	defer m.wg.Done()
	every := m.reapInterval()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
		case <-m.wakeCh:
		}
		if e := m.reapInterval(); e != every { // Configure changed lease_ttl
			every = e
			t.Reset(e)
		}
		if m.br.isOpen() {
			continue // the probe takes over
		}
		m.fitConnection()
		ctx := context.Background()
		if m.renew(ctx) != nil {
			continue
		}
		m.flush(ctx)
		if m.own.stale.Load() {
			m.reconcile(ctx) // Redis lost writes (reconcile.go)
		}
		m.sweepTombstones(ctx)
		if m.set.unsynced.Load() {
			m.resync(ctx) // a set Redis refused (an error reply) goes again
		}
		m.reap(ctx)
		m.rec.maintain(ctx)
		_, _ = m.counts(ctx)
	}
}

func (m *member) reapInterval() time.Duration { return max(m.conf().LeaseTTL/3, time.Millisecond) }

// renew extends this instance's liveness key; its version tells whether
// Redis lost writes (reconcile.go).
func (m *member) renew(ctx context.Context) error {
	id := m.ident.Load()
	floor := id.acked.Load()
	v, err := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return renewScript.Exec(ctx, m.rc(), []string{id.alive, id.inst, m.k.insts},
			[]string{strconv.FormatInt(m.conf().LeaseTTL.Milliseconds(), 10), id.id})
	}).AsInt64()
	if err == nil {
		m.noteVersion(id, floor, v)
	}
	return err
}

// flush sends the pending releases, in batches; what fails is requeued.
func (m *member) flush(ctx context.Context) {
	const batch = 256
	for _, b := range m.pend.take() {
		for i := 0; i < len(b.ids); i += batch {
			ids := b.ids[i:min(i+batch, len(b.ids))]
			// Error replies too (see Lease.Release): kept until Redis takes them.
			if err := m.execRelease(ctx, b.ident, ids); err != nil && !rueidis.IsRedisNil(err) {
				if !m.pend.putBack(pendingBatch{b.ident, b.ids[i:]}) {
					m.rotate(b.ident)
				}
				break
			}
			var lost []string
			for _, id := range ids {
				if rest, ok := strings.CutPrefix(id, "?"); ok {
					lost = append(lost, rest)
				}
			}
			if len(lost) > 0 {
				m.tombs.add(b.ident, lost, time.Now())
			}
		}
	}
}

// tombAge is how long a lost select's tombstone is kept: until no late
// select can arrive. A command runs on its connection in order, and a
// connection without an answer is dropped after connTimeout; whatever a
// dropped connection still carried ran before Redis answered anything
// newer. Twice that, and at least a lease TTL, is a wide margin.
func (m *member) tombAge() time.Duration {
	c := m.conf()
	return max(c.LeaseTTL, 2*redisconn.ConnTimeout(c.ReadTimeout))
}

// sweepTombstones deletes the tombstones old enough (tombAge) that the
// flush recorded; what fails is tried again at the next round.
func (m *member) sweepTombstones(ctx context.Context) {
	const batch = 256
	for _, b := range m.tombs.takeOlder(time.Now().Add(-m.tombAge())) {
		for i := 0; i < len(b.ids); i += batch {
			ids := b.ids[i:min(i+batch, len(b.ids))]
			res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
				return dropTombstonesScript.Exec(ctx, m.rc(), []string{b.ident.inst}, ids)
			})
			if err := res.Error(); err != nil && !rueidis.IsRedisNil(err) {
				m.tombs.putBack(pendingBatch{b.ident, b.ids[i:]})
				break
			}
		}
	}
}

// reap reclaims every instance whose liveness key has expired. Any number
// of instances may reap at once: the script is atomic per dead instance.
func (m *member) reap(ctx context.Context) {
	res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return m.rc().Do(ctx, m.rc().B().Smembers().Key(m.k.insts).Build())
	})
	ids, err := res.AsStrSlice()
	if err != nil {
		return
	}
	me := m.ident.Load().id
	for _, id := range ids {
		if id == me {
			continue
		}
		res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult { return m.rec.execReap(ctx, id) })
		if n, err := res.AsInt64(); err == nil && n > 0 {
			m.c.reclaimed.Add(uint64(n))
		}
	}
}

// fitConnection redials when read_timeout outgrew the connection (see
// conn.fit).
func (m *member) fitConnection() {
	if m.conn.fit(m.conf().ReadTimeout) != nil {
		m.c.errors.Add(1)
	}
}

// sleepBackoff waits BreakerBackoff, or until the store closes (false).
// The wait follows a reload: a shorter breaker_backoff ends it sooner
// (counted from its start).
func (m *member) sleepBackoff() bool {
	start := time.Now()
	changed := m.confChanged()
	t := time.NewTimer(m.conf().BreakerBackoff)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case <-m.done:
			return false
		case <-changed:
			changed = m.confChanged()
			t.Reset(time.Until(start.Add(m.conf().BreakerBackoff)))
		}
	}
}

// startProbe runs, once per outage, the half-open step: every
// BreakerBackoff, PING; when Redis answers, replay the member set if Redis
// came back empty, renew the liveness key, close the breaker and send the
// pending releases.
func (m *member) startProbe() {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed.Load() || !m.probing.CompareAndSwap(false, true) {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer m.probing.Store(false)
		ctx := context.Background()
		for m.sleepBackoff() {
			if m.conn.provisional.Load() && !m.conn.reconnect(m.conf().ReadTimeout) {
				m.c.errors.Add(1)
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, m.conf().ReadTimeout)
			err := m.rc().Do(cctx, m.rc().B().Ping().Build()).Error()
			cancel()
			if err != nil {
				m.c.errors.Add(1)
				continue
			}
			// The member set and what the mode kept during the outage
			// (batches) go first, so the first pick after it is exact again.
			m.resync(ctx)
			m.rec.drain()
			m.br.close()
			if m.renew(ctx) == nil {
				m.flush(ctx)
				m.rec.maintain(ctx) // e.g. slots freed during the outage go to the waiters
			}
			return
		}
	}()
}
