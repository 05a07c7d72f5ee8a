package redisleast

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
)

// batcher carries the least-request mode's picks and releases (no
// max_inflight, no queue) to Redis as numbered batches, so that the
// instance's Redis calls stay within CallRate per second whatever its
// request rate.
//
// While the budget allows (the usual case below CallRate/2 requests a
// second), every pick is exact — one script that first applies this
// instance's queued releases, then picks the least-loaded candidate — and
// every release is sent at once: Photoroom's semantics. Beyond it, a pick
// is made from the view: the global counts of the last reply plus this
// instance's own picks and releases not yet in them (delta): the view is
// never older than two budget intervals (20 ms at the default 100 calls a
// second) and the instance never piles onto a replica by itself; the pick
// is queued and goes with the next call. Redis's counts stay exact either way: every pick and release
// reaches Redis once, in order.
//
// Exactly once, in order: at most one batch is out at a time; batches are
// numbered per identity and the script applies a batch only if its number
// is above the last one applied (kept in the instance's hash, field "#").
// A batch whose reply was lost is sent again as it was before anything
// newer, so it is applied once whether or not the first try ran.
type batcher struct {
	mu      sync.Mutex
	ident   *identity        // the events below are recorded under it
	queue   []event          // not sent yet, in order
	out     *batch           // being sent (calling) or, with failed, to send again first
	failed  bool             // out's outcome is unknown: resend it as is
	calling bool             // a call is under way (at most one)
	pickOut bool             // it carries an exact pick not answered yet
	cond    sync.Cond        // on mu: a call ended
	armed   bool             // the flusher waits for the budget: no need to wake it
	seq     uint64           // number of the last batch made for ident
	view    map[string]int64 // global counts at the last reply
	delta   map[string]int64 // this instance's events not in view (queued, out)
	viewAt  time.Time        // when view was read
	tat     time.Time        // budget: theoretical arrival time (GCRA)
	// The other instances' pick rate (viewpick.go): the pool's pick
	// counter at the last reply, when, and the smoothed rate per second.
	pickCount   float64
	pickAt      time.Time
	foreignRate float64
	kick        chan struct{} // something to send
	m           *member       // the member the batches are recorded under
}

// event is one pick ('+': replica chosen from the view; '*': exact pick
// by the script among the batch's candidates) or release ('-') of request
// id. replica is what this instance counts in delta for it.
type event struct {
	kind    byte
	id      string
	replica string
}

// batch is a numbered run of events; an exact pick, if any, is its last
// event and picks among cands.
type batch struct {
	ident  *identity
	seq    uint64
	events []event
	cands  []string
	off    int
}

type reply struct {
	picked  string           // the exact pick's replica ("" none: no candidate is a member)
	counts  map[string]int64 // the pool's counts after the batch
	counter float64          // the pool's pick counter after the batch
	applied int64            // this batch's picks in it (0: applied before)
	err     error
}

// callBurst is how many calls the budget lets through at once.
const callBurst = 16

// allowLocked takes one call from the budget if there is one (GCRA:
// rate per second, callBurst at once). Refused, it means a call started
// less than one interval (1/rate) ago.
func (b *batcher) allowLocked(now time.Time, rate int) bool {
	if rate <= 0 { // call_rate went unlimited by a reload: send what is left at once
		return true
	}
	every := time.Second / time.Duration(rate)
	if b.tat.Before(now) {
		b.tat = now
	}
	if b.tat.Sub(now) > (callBurst-1)*every {
		return false
	}
	b.tat = b.tat.Add(every)
	return true
}

// nextAllowedLocked is when the budget next lets a call through.
func (b *batcher) nextAllowedLocked(rate int) time.Time {
	if rate <= 0 {
		return time.Time{}
	}
	return b.tat.Add(-(callBurst - 1) * time.Second / time.Duration(rate))
}

// resetLocked forgets everything recorded under an abandoned identity.
func (b *batcher) resetLocked(ident *identity) {
	b.ident, b.queue, b.out, b.failed, b.seq = ident, nil, nil, false, 0
	b.delta = map[string]int64{}
}

// syncIdentLocked drops what belongs to an identity the store abandoned
// (pending overflow rotates it; the reapers reclaim its records).
func (b *batcher) syncIdentLocked(cur *identity) {
	if b.ident != cur {
		b.resetLocked(cur)
	}
}

// pending is the number of events kept for Redis.
func (b *batcher) pendingLocked() int {
	n := len(b.queue)
	if b.out != nil {
		n += len(b.out.events)
	}
	return n
}

// stuck is the number of events waiting for Redis to answer again (a
// failed batch, or the breaker open); 0 while batches flow.
func (b *batcher) stuck(cur *identity, breakerOpen bool) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.syncIdentLocked(cur)
	if !b.failed && !breakerOpen {
		return 0
	}
	return b.pendingLocked()
}

// addLocked queues ev and counts it in delta.
func (b *batcher) addLocked(ev event, d int64) {
	b.queue = append(b.queue, ev)
	if ev.replica != "" {
		b.delta[ev.replica] += d
	}
}

// takeLocked makes the next batch: the failed one again, else the queue
// (plus an exact pick among cands when cands is not nil). It marks a call
// under way; finishLocked ends it.
func (b *batcher) takeLocked(pick *event, cands []string) *batch {
	b.calling = true
	if b.failed {
		return b.out // its exact pick, if any, has a replica already
	}
	b.seq++
	bt := &batch{ident: b.ident, seq: b.seq, events: b.queue}
	b.queue = nil
	if pick != nil {
		bt.events = append(bt.events, *pick)
		bt.cands = cands
		bt.off = rand.IntN(len(cands))
		b.pickOut = true
	}
	b.out = bt
	return bt
}

// finishLocked ends the call that sent bt: on success the view becomes
// the reply's counts and bt's events leave delta (they are in the view
// now); on failure bt is kept to be sent again as is.
func (b *batcher) finishLocked(bt *batch, r reply) {
	b.calling, b.pickOut = false, false
	b.cond.Broadcast()
	if bt.ident != b.ident { // abandoned meanwhile
		return
	}
	if r.err != nil {
		b.failed = true
		return
	}
	for _, ev := range bt.events {
		if ev.replica == "" {
			continue
		}
		if ev.kind == '-' {
			b.delta[ev.replica]++
		} else {
			b.delta[ev.replica]--
		}
	}
	for a, n := range b.delta {
		if n == 0 {
			delete(b.delta, a)
		}
	}
	b.out, b.failed = nil, false
	b.followLostPickLocked(bt, r.picked)
	now := time.Now()
	b.observePicksLocked(r.counter, r.applied, now)
	b.view, b.viewAt = r.counts, now
}

// followLostPickLocked moves an exact pick whose first reply was lost to
// the replica its request went to. That request went to a replica picked
// from the view (the event's replica), but the script picks by itself,
// from Redis's counts, when the lost try ran or the batch went again:
// picked is where it recorded the request ("" nowhere). Unless the
// request has ended already (its release, queued behind, takes whatever
// was recorded), a release of the record and a pick of the replica follow
// in the next batch.
func (b *batcher) followLostPickLocked(bt *batch, picked string) {
	if len(bt.events) == 0 {
		return
	}
	ev := bt.events[len(bt.events)-1]
	if ev.kind != '*' || ev.replica == "" || ev.replica == picked {
		return // no exact pick, or its reply came back (the lease is on picked), or it agrees
	}
	for _, q := range b.queue {
		if q.kind == '-' && q.id == ev.id {
			return
		}
	}
	if picked != "" {
		b.addLocked(event{'-', ev.id, picked}, -1)
	}
	b.addLocked(event{'+', ev.id, ev.replica}, 1)
}

// sendQueuedLocked sends the next batch (called with mu held, returns with
// it released) and returns the call's error.
func (b *batcher) sendQueuedLocked() error {
	bt := b.takeLocked(nil, nil)
	b.mu.Unlock()
	r := b.send(bt)
	b.mu.Lock()
	b.finishLocked(bt, r)
	b.mu.Unlock()
	return r.err
}

// poke wakes the flusher, unless it already waits for the budget (it
// sends what is queued then) or a call is out (its end pokes): a wake-up
// costs more CPU than the pick.
func (b *batcher) poke() {
	b.mu.Lock()
	idle := !b.armed && !b.calling
	b.mu.Unlock()
	if idle {
		b.kick1()
	}
}

// kick1 wakes the flusher unconditionally.
func (b *batcher) kick1() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// pick is Select in the least-request mode's batches (see batcher): an
// exact pick while the call budget allows, else a pick from the view.
// A view pick never uses a view older than two budget intervals (it waits
// for the call under way instead; under a steady load a call starts every
// interval) nor runs beside an exact pick whose
// replica is not known yet (it would not see it).
func (b *batcher) pick(ctx context.Context, cfg *Config, candidates []string, resynced bool) (*Lease, error) {
	s := b.m
	ident := s.ident.Load()
	req := strconv.FormatUint(s.seq.Add(1), 36)
	rate := cfg.CallRate
	b.mu.Lock()
	for {
		b.syncIdentLocked(ident)
		if b.pendingLocked() >= cfg.PendingMax {
			b.mu.Unlock()
			s.rotate(ident)
			return s.fallback(candidates)
		}
		now := time.Now()
		if b.calling && (b.pickOut || now.Sub(b.viewAt) > 2*time.Second/time.Duration(rate)) {
			b.cond.Wait() // the call ends within ReadTimeout
			continue
		}
		if b.calling || b.failed || !b.allowLocked(now, rate) {
			addr := b.viewPickLocked(candidates, rand.IntN(len(candidates)), time.Now())
			b.addLocked(event{'+', req, addr}, 1)
			l := b.holdLocked(addr, ident, req)
			failed := b.failed
			b.mu.Unlock()
			b.poke()
			s.handOut(l)
			if failed { // Redis did not answer the last batch: a local pick
				s.c.fallbacks.Add(1)
				l.Fallback = true
			} else {
				s.c.viewPicks.Add(1)
				l.why = lb.ReasonViewPick
			}
			return l, nil
		}
		break
	}
	bt := b.takeLocked(&event{kind: '*', id: req}, candidates)
	b.mu.Unlock()
	r := b.send(bt)
	b.mu.Lock()
	if r.err != nil {
		// The pick may have run: it stays in the batch, sent again until
		// Redis answers, and this request counts on a replica chosen from
		// the view meanwhile (its release follows the pick in Redis).
		addr := b.viewPickLocked(candidates, rand.IntN(len(candidates)), time.Now())
		bt.events[len(bt.events)-1].replica = addr
		b.delta[addr]++
		b.finishLocked(bt, r)
		if ctx.Err() != nil {
			b.mu.Unlock()
			b.poke()
			b.release(ident, req, addr, nil)
			return nil, ctx.Err()
		}
		l := b.holdLocked(addr, ident, req)
		b.mu.Unlock()
		b.poke()
		s.c.fallbacks.Add(1)
		s.handOut(l)
		l.Fallback = true
		return l, nil
	}
	b.finishLocked(bt, r)
	var l *Lease
	if r.picked != "" {
		l = b.holdLocked(r.picked, ident, req)
	}
	more := len(b.queue) > 0
	b.mu.Unlock()
	if more {
		b.poke()
	}
	if l != nil {
		return s.handOut(l), nil
	}
	// No candidate is a member: Redis may have restarted empty.
	if resynced || !s.resync(ctx) {
		return nil, ErrNoCandidates
	}
	return b.pick(ctx, cfg, candidates, true)
}

// holdLocked makes the lease of a batched pick, held (with mu, so that
// quiesce sees the lease and its event together).
func (b *batcher) holdLocked(addr string, ident *identity, req string) *Lease {
	l := &Lease{Addr: addr, m: b.m, ident: ident, req: req, batched: true}
	b.m.own.hold(l)
	return l
}

// release queues the release of a batched pick (l, nil for a pick that
// made no lease) and sends it at once if the budget allows (from the
// caller's goroutine: Release runs off the request path), else leaves it
// to the flusher.
func (b *batcher) release(ident *identity, req, addr string, l *Lease) {
	s := b.m
	b.mu.Lock()
	if l != nil {
		s.own.drop(l)
	}
	if b.ident != ident {
		b.mu.Unlock() // abandoned identity: the reapers reclaim it
		return
	}
	cfg := s.cfgp.Load()
	if b.pendingLocked() >= cfg.PendingMax {
		b.mu.Unlock()
		s.rotate(ident)
		return
	}
	b.addLocked(event{'-', req, addr}, -1)
	if b.calling || s.br.isOpen() || !b.allowLocked(time.Now(), cfg.CallRate) {
		b.mu.Unlock()
		b.poke()
		return
	}
	bt := b.takeLocked(nil, nil)
	b.mu.Unlock()
	b.finishSend(bt, b.send(bt))
}

// finishSend ends a call outside pick and wakes the flusher if more is
// queued (or the batch must go again).
func (b *batcher) finishSend(bt *batch, r reply) {
	s := b.m
	b.mu.Lock()
	b.finishLocked(bt, r)
	more := len(b.queue) > 0 || b.failed
	b.mu.Unlock()
	// After a failure with the breaker open, the probe kicks the flusher
	// when Redis answers.
	if more && (r.err == nil || !s.br.isOpen()) {
		b.poke()
	}
}

// flusher is the flusher goroutine, one per store: the backstop that
// sends what is queued when no pick or release comes along to send it.
// Under load the picks and releases send the batches themselves, from
// their own goroutines, as soon as the budget allows; the flusher waits
// one budget interval beyond that before it does (each wake-up of an idle
// goroutine costs about as much CPU as the call).
func (b *batcher) flusher() {
	s := b.m
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-b.kick:
		}
		for !s.br.isOpen() { // else the probe kicks when Redis answers
			b.mu.Lock()
			b.syncIdentLocked(s.ident.Load())
			if b.calling || (len(b.queue) == 0 && !b.failed) {
				b.armed = false
				b.mu.Unlock()
				break // a call under way pokes at its end if more is queued
			}
			rate := s.conf().CallRate
			now := time.Now()
			if !b.armed {
				b.armed = true
				wait := time.Duration(0)
				if rate > 0 {
					wait = max(b.nextAllowedLocked(rate).Sub(now), 0) + time.Second/time.Duration(rate)
				}
				b.mu.Unlock()
				timer.Reset(wait)
				select {
				case <-s.done:
					return
				case <-timer.C:
				}
				continue
			}
			b.armed = false
			if !b.allowLocked(now, rate) {
				b.mu.Unlock()
				continue // armed again for the next slot
			}
			if b.sendQueuedLocked() != nil {
				break // the breaker counted it; the next kick (or the probe) retries
			}
		}
		// Not waiting any more, whichever way it left (the breaker may have
		// opened during the wait): the next poke must wake it.
		b.mu.Lock()
		b.armed = false
		b.mu.Unlock()
	}
}

// drain sends everything queued, ignoring the budget (Close, and
// the maintenance loop as a safety net); false if a call failed.
func (b *batcher) drain() bool {
	s := b.m
	for range 64 {
		b.mu.Lock()
		b.syncIdentLocked(s.ident.Load())
		if b.calling || (len(b.queue) == 0 && !b.failed) {
			b.mu.Unlock()
			return true
		}
		if b.sendQueuedLocked() != nil {
			return false
		}
	}
	return true
}

// quiesce waits for the call under way, sends what is queued holding mu
// (so that nothing is queued meanwhile: a few calls at most) and runs fn
// still holding it (reconcile: the held leases are then exactly what
// Redis holds). A failed call skips fn.
func (b *batcher) quiesce(fn func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.calling {
		b.cond.Wait()
	}
	b.syncIdentLocked(b.m.ident.Load())
	for len(b.queue) > 0 || b.failed { // the failed batch, the queue, a lost pick's move
		bt := b.takeLocked(nil, nil)
		r := b.send(bt)
		b.finishLocked(bt, r)
		if r.err != nil {
			return
		}
	}
	fn()
}

// send runs the batch script for bt within ReadTimeout.
func (b *batcher) send(bt *batch) reply {
	s := b.m
	floor := bt.ident.acked.Load()
	args := make([]string, 0, 5+len(bt.cands)+3*len(bt.events))
	args = append(args, strconv.FormatInt(s.conf().LeaseTTL.Milliseconds(), 10), bt.ident.id,
		strconv.FormatUint(bt.seq, 10), strconv.Itoa(bt.off), strconv.Itoa(len(bt.cands)))
	args = append(args, bt.cands...)
	for _, ev := range bt.events {
		args = append(args, string(ev.kind), ev.id, ev.replica)
	}
	res := s.call(context.Background(), func(ctx context.Context) rueidis.RedisResult {
		return batchScript.Exec(ctx, s.rc(), []string{s.k.load, s.k.gone, bt.ident.alive, bt.ident.inst, s.k.insts, s.k.picks}, args)
	})
	arr, err := res.ToArray()
	if err == nil && len(arr) != 6 {
		err = errBadReply
	}
	if err != nil {
		return reply{err: err}
	}
	s.noteVersion(bt.ident, floor, versionOf(arr, 5))
	picked, _ := arr[1].ToString()
	zs, err := arr[2].AsStrSlice()
	if err != nil || len(zs)%2 != 0 {
		return reply{err: errBadReply}
	}
	counts := make(map[string]int64, len(zs)/2)
	for i := 0; i < len(zs); i += 2 {
		n, err := strconv.ParseFloat(zs[i+1], 64)
		if err != nil {
			return reply{err: errBadReply}
		}
		counts[zs[i]] = countOf(n)
	}
	c, _ := arr[3].ToString()
	counter, err := strconv.ParseFloat(c, 64)
	if err != nil {
		return reply{err: errBadReply}
	}
	applied, _ := arr[4].AsInt64()
	s.set.setCounts(counts)
	return reply{picked: picked, counts: counts, counter: counter, applied: applied}
}
