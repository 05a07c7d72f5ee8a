package redisleast

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// Lease is one request counted in flight on Addr. Release it exactly once.
type Lease struct {
	Addr string
	// Fallback is true when Redis was unavailable and the replica was
	// picked from this instance's own counts; such a lease is not in Redis
	// (in the least-request mode: it reaches Redis when Redis answers
	// again, see batcher).
	Fallback bool

	s        *Store
	ident    *identity
	req      string
	start    time.Time
	hl       *tracker.Lease // passive health; nil for a replica the tracker does not know
	batched  bool           // recorded through the batcher (least-request mode)
	released atomic.Bool
}

// Select picks the least-loaded of candidates (the healthy replicas),
// globally through Redis in one round trip, and counts a request on it.
// Ties go to a random one of the least loaded. While the breaker is open
// (or the call fails) it picks from this instance's own counts instead, so
// it never waits on Redis longer than ReadTimeout.
//
// In queueing mode (QueueTimeout > 0) a request that finds no free slot,
// or finds others already queued, waits in the pool's global queue until
// a slot is handed to it, ctx is done (ctx.Err()) or QueueTimeout passes
// (ErrQueueTimeout); see queue.go.
//
// Candidates this instance marked down after failed attempts (passive
// health, Config.MaxFails) are left out; none left: lb.ErrAllDown. A
// queued request is never handed a member left out this way, nor a
// member of the last Sync that is not a candidate.
//
// After Close it returns lb.ErrShutdown (also to requests still waiting
// in the queue when Close runs).
func (s *Store) Select(ctx context.Context, candidates []string) (*Lease, error) {
	if s.closed.Load() {
		return nil, lb.ErrShutdown
	}
	if len(candidates) == 0 {
		return nil, ErrNoCandidates
	}
	candidates = s.healthy(candidates)
	if len(candidates) == 0 {
		return nil, lb.ErrAllDown
	}
	if s.br.isOpen() {
		return s.fallback(candidates)
	}
	if c := s.cfgp.Load(); c.MaxInflight == 0 && c.CallRate > 0 && !s.queueing() {
		return s.selectBatched(ctx, c, candidates, false)
	}
	// One deadline for the whole call: a retry never extends the wait.
	deadline := time.Now().Add(s.conf().ReadTimeout)
	resynced, retried := false, false
	for {
		ident := s.ident.Load()
		req := strconv.FormatUint(s.seq.Add(1), 36)
		args := make([]string, 0, 5+len(candidates))
		args = append(args, strconv.Itoa(s.conf().MaxInflight), strconv.FormatInt(s.conf().LeaseTTL.Milliseconds(), 10),
			req, ident.id, strconv.Itoa(rand.IntN(len(candidates))))
		var res rueidis.RedisResult
		var wait chan string
		if s.queueing() {
			// Listen before asking: the hand-over may be published
			// before the script's reply arrives.
			wait = s.waiters.add(token(ident, req))
			args = append(args, s.k.tag, s.avoidList(candidates))
			args = append(args, candidates...)
			// Not cut short by the client: a reply lost to a
			// cancellation would leave the request queued (or holding a
			// slot) until the pending release is flushed; with the
			// reply, await sees ctx done and leaves the queue at once.
			res = s.callUntil(context.WithoutCancel(ctx), deadline, func(ctx context.Context) rueidis.RedisResult {
				return selectQueueScript.Exec(ctx, s.rc(),
					[]string{s.k.load, ident.alive, ident.inst, s.k.insts, s.k.queue, s.k.waiters, s.k.assigned, s.k.avoid}, args)
			})
		} else {
			args = append(args, candidates...)
			res = s.callUntil(ctx, deadline, func(ctx context.Context) rueidis.RedisResult {
				return selectScript.Exec(ctx, s.rc(), []string{s.k.load, ident.alive, ident.inst, s.k.insts}, args)
			})
		}
		arr, err := res.ToArray()
		if err == nil && len(arr) != 2 {
			err = errBadReply
		}
		if err != nil {
			if wait != nil {
				s.waiters.drop(token(ident, req))
			}
			if transportErr(err) {
				// It may have run, or may still run: release it (or
				// bar it) when Redis answers again.
				s.queueRelease(ident, "?"+req)
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if s.closed.Load() { // Close closed the client under this call
				return nil, lb.ErrShutdown
			}
			// A connection broken by a Redis restart fails once (EOF)
			// and is redialled: try again within the same deadline.
			if !retried && transportErr(err) && !errors.Is(err, context.DeadlineExceeded) && !s.br.isOpen() {
				retried = true
				continue
			}
			return s.fallback(candidates)
		}
		code, _ := arr[0].AsInt64()
		addr, _ := arr[1].ToString()
		if wait != nil && code == 4 {
			return s.await(ctx, ident, req, wait)
		}
		if wait != nil {
			s.waiters.drop(token(ident, req))
		}
		switch code {
		case 1:
			return s.lease(addr, ident, req, false), nil
		case 2:
			s.c.shed.Add(1)
			return nil, ErrSaturated
		case 0:
		default: // 3 (barred) cannot happen for a fresh request id
			return s.fallback(candidates)
		}
		// No candidate is a member: Redis may have restarted empty.
		if resynced || !s.resync(ctx) {
			return nil, ErrNoCandidates
		}
		resynced = true
	}
}

type replyError string

func (e replyError) Error() string { return string(e) }

const errBadReply = replyError("redis select: unexpected reply shape")

// fallback picks from this instance's own counts; MaxInflight applies to
// them, the only view there is.
func (s *Store) fallback(candidates []string) (*Lease, error) {
	addr, n := s.local.least(candidates, rand.IntN(len(candidates)))
	if s.conf().MaxInflight > 0 && n >= int64(s.conf().MaxInflight) {
		s.c.shed.Add(1)
		return nil, ErrSaturated
	}
	s.local.get(addr).Add(1)
	s.c.selections.Add(1)
	s.c.fallbacks.Add(1)
	return &Lease{Addr: addr, Fallback: true, s: s, start: time.Now(), hl: s.health.Acquire(addr)}, nil
}

// healthy is candidates less the replicas passive health has down (the
// input itself when none is).
func (s *Store) healthy(candidates []string) []string {
	for i, a := range candidates {
		if s.health.Down(a) {
			out := slices.Clone(candidates[:i])
			for _, b := range candidates[i+1:] {
				if !s.health.Down(b) {
					out = append(out, b)
				}
			}
			return out
		}
	}
	return candidates
}

// avoidList names, comma-separated, the members of the last Sync that a
// queued request picking among candidates must not be handed (down, or
// excluded by the caller); "" when there are none.
func (s *Store) avoidList(candidates []string) string {
	s.mu.Lock()
	members := s.last
	s.mu.Unlock()
	var b strings.Builder
	for _, m := range members {
		if !slices.Contains(candidates, m) {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(m)
		}
	}
	return b.String()
}

// Release ends the request. Only the first call counts (later ones return
// false). A Redis lease is released in Redis within ReadTimeout, or queued
// until Redis answers again; call it off the request path (for example
// from context.AfterFunc). The outcome feeds this instance's passive
// health (a Failure counts against the replica) and RetryAfter (how long
// successful leases are held).
func (l *Lease) Release(o lb.Outcome) bool {
	if !l.released.CompareAndSwap(false, true) {
		return false
	}
	s := l.s
	if l.hl != nil {
		l.hl.Release(o)
	}
	if o.Kind == lb.Success && !l.start.IsZero() {
		s.svc.observe(time.Since(l.start))
	}
	s.local.get(l.Addr).Add(-1)
	s.c.releases.Add(1)
	if l.batched {
		if !s.closed.Load() { // else Close handed it to the reapers
			s.releaseBatched(l.ident, l.req, l.Addr)
		}
		return true
	}
	if l.Fallback || s.closed.Load() {
		return true // not in Redis, or Close already handed it to the reapers
	}
	if s.br.isOpen() {
		s.queueRelease(l.ident, l.req)
		return true
	}
	// Any failure keeps the release for the maintenance loop: a network
	// error, or an error reply (READONLY in a failover, NOREPLICAS,
	// LOADING, BUSY, NOPERM) — dropping it would leave the count +1.
	if err := s.execRelease(context.Background(), l.ident, []string{l.req}).Error(); err != nil && !rueidis.IsRedisNil(err) {
		s.queueRelease(l.ident, l.req)
	}
	return true
}

// queueRelease keeps a release for later; on overflow the instance
// rotates its identity (see pending).
func (s *Store) queueRelease(ident *identity, req string) {
	if s.pend.add(ident, req) {
		return
	}
	s.rotate(ident)
}

// rotate abandons ident (if still current) for a fresh identity.
func (s *Store) rotate(old *identity) {
	if s.ident.CompareAndSwap(old, s.newIdentity()) {
		s.pend.clear()
		if s.rotated != nil {
			select { // resubscribe under the new identity
			case s.rotated <- struct{}{}:
			default:
			}
		}
	}
}
