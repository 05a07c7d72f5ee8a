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
// releases, replay a set Redis did not take, reap dead instances, dispatch
// free slots to waiters (queueing mode) and refresh the global counts the
// metrics report; and redial if read_timeout outgrew the connection.
//
// Reclaim bound: an instance that dies renewed its key at most LeaseTTL/3
// before; the key expires LeaseTTL after that renewal, and some live
// instance reaps within one more LeaseTTL/3. So a dead instance's requests
// stop counting at most LeaseTTL + LeaseTTL/3 after it died.
func (s *Store) loop() {
	defer s.wg.Done()
	every := s.reapInterval()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		case <-s.reconf:
		}
		if e := s.reapInterval(); e != every { // Configure changed lease_ttl
			every = e
			t.Reset(e)
		}
		if s.br.isOpen() {
			continue // the probe takes over
		}
		s.fitConnection()
		ctx := context.Background()
		if s.renew(ctx) != nil {
			continue
		}
		s.flush(ctx)
		s.batch.poke() // a batch that failed below the breaker's limit goes again
		s.sweepTombstones(ctx)
		if s.unsynced.Load() {
			s.resync(ctx) // a set Redis refused (an error reply) goes again
		}
		s.reap(ctx)
		if s.queueing() {
			s.kick(ctx)
		}
		_, _ = s.Counts(ctx)
	}
}

func (s *Store) reapInterval() time.Duration { return max(s.conf().LeaseTTL/3, time.Millisecond) }

// renew extends this instance's liveness key.
func (s *Store) renew(ctx context.Context) error {
	id := s.ident.Load()
	return s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return s.rc().Do(ctx, s.rc().B().Set().Key(id.alive).Value("1").Px(s.conf().LeaseTTL).Build())
	}).Error()
}

// flush sends the pending releases, in batches; what fails is requeued.
func (s *Store) flush(ctx context.Context) {
	const batch = 256
	for _, b := range s.pend.take() {
		for i := 0; i < len(b.ids); i += batch {
			ids := b.ids[i:min(i+batch, len(b.ids))]
			// Error replies too (see Lease.Release): kept until Redis takes them.
			if err := s.execRelease(ctx, b.ident, ids).Error(); err != nil && !rueidis.IsRedisNil(err) {
				s.pend.putBack(pendingBatch{b.ident, b.ids[i:]})
				break
			}
			var lost []string
			for _, id := range ids {
				if rest, ok := strings.CutPrefix(id, "?"); ok {
					lost = append(lost, rest)
				}
			}
			if len(lost) > 0 {
				s.tombs.add(b.ident, lost, time.Now())
			}
		}
	}
}

// tombAge is how long a lost select's tombstone is kept: until no late
// select can arrive. A command runs on its connection in order, and a
// connection without an answer is dropped after connTimeout; whatever a
// dropped connection still carried ran before Redis answered anything
// newer. Twice that, and at least a lease TTL, is a wide margin.
func (s *Store) tombAge() time.Duration {
	c := s.conf()
	return max(c.LeaseTTL, 2*redisconn.ConnTimeout(c.ReadTimeout))
}

// sweepTombstones deletes the tombstones old enough (tombAge) that the
// flush recorded; what fails is tried again at the next round.
func (s *Store) sweepTombstones(ctx context.Context) {
	const batch = 256
	for _, b := range s.tombs.takeOlder(time.Now().Add(-s.tombAge())) {
		for i := 0; i < len(b.ids); i += batch {
			ids := b.ids[i:min(i+batch, len(b.ids))]
			res := s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
				return dropTombstonesScript.Exec(ctx, s.rc(), []string{b.ident.inst}, ids)
			})
			if err := res.Error(); err != nil && !rueidis.IsRedisNil(err) {
				s.tombs.putBack(pendingBatch{b.ident, b.ids[i:]})
				break
			}
		}
	}
}

// reap reclaims every instance whose liveness key has expired. Any number
// of instances may reap at once: the script is atomic per dead instance.
func (s *Store) reap(ctx context.Context) {
	res := s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return s.rc().Do(ctx, s.rc().B().Smembers().Key(s.k.insts).Build())
	})
	ids, err := res.AsStrSlice()
	if err != nil {
		return
	}
	me := s.ident.Load().id
	for _, id := range ids {
		if id == me {
			continue
		}
		res := s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
			if s.queueing() {
				return reapQueueScript.Exec(ctx, s.rc(),
					[]string{s.k.load, s.k.gone, s.k.alive(id), s.k.inst(id), s.k.insts, s.k.assigned},
					[]string{id, strconv.Itoa(s.conf().MaxInflight), s.k.tag})
			}
			return reapScript.Exec(ctx, s.rc(),
				[]string{s.k.load, s.k.gone, s.k.alive(id), s.k.inst(id), s.k.insts}, []string{id})
		})
		if n, err := res.AsInt64(); err == nil && n > 0 {
			s.c.reclaimed.Add(uint64(n))
		}
	}
}

// reconnect replaces the placeholder client of a store started without
// Redis by a real one (with cluster discovery) once Redis answers. No call
// uses the placeholder meanwhile: the breaker has been open throughout.
func (s *Store) reconnect() bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.closed.Load() {
		return false
	}
	opt := s.opt
	opt.ConnWriteTimeout = max(opt.ConnWriteTimeout, redisconn.ConnTimeout(s.conf().ReadTimeout))
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return false
	}
	s.opt = opt
	old := s.cl.Swap(&clientRef{client})
	s.provisional.Store(false)
	old.Close()
	return true
}

// fitConnection gives the store a new client when read_timeout was
// raised beyond what the current connection allows: rueidis's
// ConnWriteTimeout, fixed per client, drops a connection whose reply
// takes longer, which would cap the read timeout silently. Same options
// otherwise, same identity: nothing recorded in Redis changes hands.
// The old client is closed after a grace period, so a call that had
// just loaded it still runs (Close lets queued commands finish anyway).
// Redis unreachable: it tries again at the next round.
func (s *Store) fitConnection() {
	want := redisconn.ConnTimeout(s.conf().ReadTimeout)
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if want <= s.opt.ConnWriteTimeout || s.provisional.Load() || s.closed.Load() {
		return
	}
	opt := s.opt
	opt.ConnWriteTimeout = want
	client, err := rueidis.NewClient(opt)
	if err != nil {
		s.c.errors.Add(1)
		return
	}
	grace := s.opt.ConnWriteTimeout
	s.opt = opt
	old := s.cl.Swap(&clientRef{client}).Client
	if s.retired == nil {
		s.retired = map[rueidis.Client]bool{}
	}
	s.retired[old] = true
	time.AfterFunc(grace, func() {
		s.connMu.Lock()
		mine := s.retired[old]
		delete(s.retired, old)
		s.connMu.Unlock()
		if mine { // else Close took it
			old.Close()
		}
	})
}

// connWriteTimeout is the current client's connection-level deadline.
func (s *Store) connWriteTimeout() time.Duration {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.opt.ConnWriteTimeout
}

// startProbe runs, once per outage, the half-open step: every
// BreakerBackoff, PING; when Redis answers, replay the member set if Redis
// came back empty, renew the liveness key, close the breaker and send the
// pending releases.
func (s *Store) startProbe() {
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed.Load() || !s.probing.CompareAndSwap(false, true) {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.probing.Store(false)
		ctx := context.Background()
		for backoffSleep(s.done, s.conf().BreakerBackoff) {
			if s.provisional.Load() && !s.reconnect() {
				s.c.errors.Add(1)
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, s.conf().ReadTimeout)
			err := s.rc().Do(cctx, s.rc().B().Ping().Build()).Error()
			cancel()
			if err != nil {
				s.c.errors.Add(1)
				continue
			}
			// The member set and the batches kept during the outage go
			// first, so the first pick after it is exact again.
			s.resync(ctx)
			s.drainBatches()
			s.br.close()
			if s.renew(ctx) == nil {
				s.flush(ctx)
				if s.queueing() {
					s.kick(ctx) // slots freed during the outage go to the waiters
				}
			}
			return
		}
	}()
}
