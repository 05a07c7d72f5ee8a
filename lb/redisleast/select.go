package redisleast

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// Lease is one request counted in flight on Addr. Release it exactly once.
type Lease struct {
	Addr string
	// Fallback is true when the replica was picked from this instance's
	// own counts: Redis was unavailable (in the least-request mode's
	// batches such a lease reaches Redis when Redis answers again, see
	// batcher; otherwise it is not in Redis), or none of the candidates
	// was a member in Redis (another instance synced a different set, see
	// Store.Pick: not in Redis).
	Fallback bool

	m        *member
	ident    *identity // nil: picked locally, never recorded in Redis
	req      string
	start    time.Time
	hl       *tracker.Lease // passive health (admit); nil for a replica the tracker does not know
	batched  bool           // recorded through the batcher (least-request mode)
	why      string         // the pick's reason when not an exact pick (see reason)
	released atomic.Bool
	// prev, next link it into the member's held leases (ownRecords).
	prev, next *Lease
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
// health, Config.MaxFails) are left out; none left: lb.ErrAllDown. One
// whose down time is over takes one request at a time, its probe: a pick
// that lands on it while another request probes it is undone and made
// again without it (probe.go), a queued request handed it included. A
// queued request is only ever handed one of its candidates (less those
// left out this way); if none of them is a member any more it is refused
// (errors.Is lb.ErrAllDown; Pick picks again).
//
// After Close it returns lb.ErrShutdown (also to requests still waiting
// in the queue when Close runs).
func (s *Store) Select(ctx context.Context, candidates []string) (*Lease, error) {
	return s.selectWaiting(ctx, candidates, nil)
}

// selectWaiting is Select that tells onWait (if not nil) when the request
// waits in the queue.
func (s *Store) selectWaiting(ctx context.Context, candidates []string, onWait lb.Waiter) (*Lease, error) {
	if s.closed.Load() {
		return nil, lb.ErrShutdown
	}
	if len(candidates) == 0 {
		return nil, ErrNoCandidates
	}
	return s.pickUsable(candidates, func(cands []string) (*Lease, error) {
		if s.br.isOpen() {
			return s.fallback(cands)
		}
		l, err := s.mode.pick(ctx, cands, onWait)
		if l != nil && l.why == lb.ReasonQueued {
			onWait = nil // told once (lb.Request.Waiter), if health refuses the slot
		}
		return l, err
	})
}

// Select script replies (selectScript, selectQueueScript).
const (
	pickNone      = 0  // no candidate is a member
	pickLeased    = 1  // the replica is the request's
	pickSaturated = 2  // the least loaded is at MaxInflight
	pickQueued    = 4  // queued (queue mode); 3 (barred) cannot answer a fresh request id
	pickNoAnswer  = -1 // Redis did not answer: pick locally
)

// picked is a select script's answer for request req of ident.
type picked struct {
	code  int64
	addr  string
	ident *identity
	req   string
}

// scriptPick runs a select script until it has an answer other than
// pickNone: one deadline (ReadTimeout) for the whole call, one retry
// after a broken connection (a Redis restart fails a connection once),
// and the member set replayed once when no candidate is a member (Redis
// restarted empty). run sends the script for one try: req is a fresh
// request id, args the arguments every select script starts with. A try
// whose reply was lost is released as a lost select once Redis answers
// (it may have run, or may still run). The error is ctx's, lb.ErrShutdown
// or ErrNoCandidates.
func (m *member) scriptPick(ctx context.Context, candidates []string,
	run func(deadline time.Time, ident *identity, req string, args []string) rueidis.RedisResult) (picked, error) {
	deadline := time.Now().Add(m.conf().ReadTimeout)
	resynced, retried := false, false
	for {
		ident := m.ident.Load()
		floor := ident.acked.Load()
		req := strconv.FormatUint(m.seq.Add(1), 36)
		c := m.conf()
		args := make([]string, 0, 7+len(candidates))
		args = append(args, strconv.Itoa(c.MaxInflight), strconv.FormatInt(c.LeaseTTL.Milliseconds(), 10),
			req, ident.id, strconv.Itoa(rand.IntN(len(candidates))))
		arr, err := run(deadline, ident, req, args).ToArray()
		if err == nil && len(arr) != 3 {
			err = errBadReply
		}
		if err != nil {
			if transportErr(err) {
				m.queueRelease(ident, "?"+req)
			}
			if ctx.Err() != nil {
				return picked{}, ctx.Err()
			}
			if m.closed.Load() { // Close closed the client under this call
				return picked{}, lb.ErrShutdown
			}
			if !retried && transportErr(err) && !errors.Is(err, context.DeadlineExceeded) && !m.br.isOpen() {
				retried = true
				continue
			}
			return picked{code: pickNoAnswer}, nil
		}
		m.noteVersion(ident, floor, versionOf(arr, 2))
		code, _ := arr[0].AsInt64()
		addr, _ := arr[1].ToString()
		if code != pickNone {
			return picked{code, addr, ident, req}, nil
		}
		if resynced || !m.resync(ctx) {
			return picked{}, ErrNoCandidates
		}
		resynced = true
	}
}

// leaseFor turns a select script's final answer into a lease.
func (m *member) leaseFor(p picked, candidates []string) (*Lease, error) {
	switch p.code {
	case pickLeased:
		return m.lease(p.addr, p.ident, p.req), nil
	case pickSaturated:
		m.c.shed.Add(1)
		return nil, ErrSaturated
	}
	return m.fallback(candidates) // no answer (or barred: cannot happen for a fresh request id)
}

type replyError string

func (e replyError) Error() string { return string(e) }

const errBadReply = replyError("redis select: unexpected reply shape")

// lease hands out a lease on addr recorded under ident as req by one
// script (own.mu read-held).
func (m *member) lease(addr string, ident *identity, req string) *Lease {
	l := &Lease{Addr: addr, m: m, ident: ident, req: req}
	m.own.hold(l)
	return m.handOut(l)
}

// handOut counts l, held already, as handed out (passive health takes
// it, or undoes it, once the pick is over: admit).
func (m *member) handOut(l *Lease) *Lease {
	m.local.get(l.Addr).Add(1)
	m.c.selections.Add(1)
	l.start = time.Now()
	return l
}

// fallback picks from this instance's own counts (Redis unavailable).
func (m *member) fallback(candidates []string) (*Lease, error) {
	return m.pickLocal(candidates, &m.c.fallbacks)
}

// pickLocal picks from this instance's own counts and counts the pick on
// why (fallbacks, or mismatches: see Store.Pick); MaxInflight applies to
// them, the only view there is. The lease is not in Redis: its release
// only takes it off the local count.
func (m *member) pickLocal(candidates []string, why *atomic.Uint64) (*Lease, error) {
	addr, n := m.local.least(candidates, rand.IntN(len(candidates)))
	if m.conf().MaxInflight > 0 && n >= int64(m.conf().MaxInflight) {
		m.c.shed.Add(1)
		return nil, ErrSaturated
	}
	m.local.get(addr).Add(1)
	m.c.selections.Add(1)
	why.Add(1)
	return &Lease{Addr: addr, Fallback: true, m: m, start: time.Now()}, nil
}

// healthy is candidates less the replicas passive health has down (the
// input itself when none is).
func (m *member) healthy(candidates []string) []string {
	for i, a := range candidates {
		if m.health.Down(a) {
			out := slices.Clone(candidates[:i])
			for _, b := range candidates[i+1:] {
				if !m.health.Down(b) {
					out = append(out, b)
				}
			}
			return out
		}
	}
	return candidates
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
	m := l.m
	if l.hl != nil {
		l.hl.Release(o)
	}
	if o.Kind == lb.Success && !l.start.IsZero() {
		m.svc.observe(time.Since(l.start))
	}
	m.local.get(l.Addr).Add(-1)
	m.c.releases.Add(1)
	if l.ident == nil {
		return true // not in Redis
	}
	if m.closed.Load() {
		m.own.drop(l) // Close handed it to the reapers
		return true
	}
	m.rec.release(l)
	return true
}
