package redisleast

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluice-router/sluice/lb"
)

// Queueing mode (Config.QueueTimeout > 0).
//
// Instead of shedding at MaxInflight, a request waits in ONE queue shared
// by every instance of the pool: N proxies behave like one central queue
// with late binding. The contract (scripts in queue_scripts.go):
//
//   - Select takes the least-loaded candidate only if it has a free slot
//     and nobody is queued; otherwise its token joins the global FIFO
//     ({tag}:queue, {tag}:waiters). A new request never takes a slot
//     that a waiting one may use.
//   - A waiter carries its candidates ({tag}:cands) and is only ever
//     handed one of them: the instances' pools may differ (set-backends
//     reaching them one after the other, different static lists), and the
//     member set in Redis is the last one any instance synced.
//   - Whatever frees a slot (a release, a reaped instance, a Sync adding
//     replicas, a lost-select cleanup, the background kick) runs dispatch in
//     the same script: the oldest live waiter anywhere that may use a free
//     slot gets the least-loaded free one of its candidates, recorded under
//     the WAITER's instance hash (so if that instance dies the reaper
//     reclaims the slot) and in {tag}:assigned, and the waiter's instance
//     is told by PUBLISH on its channel. Nobody polls Redis. A waiter that
//     may not use the free slot keeps its place; one none of whose
//     candidates is a member any more is refused, and Store.Pick picks
//     for it again (see dispatchFn).
//   - A hand-over its instance's passive health refuses (the replica went
//     down, or its one probe is taken, after the waiter queued) is given
//     back, and the waiter takes its old place again ({tag}:qseq), less
//     that replica (admitHanded, requeueQueueScript): it is not put behind
//     those that queued after it, and its QueueTimeout still counts from
//     its arrival.
//   - Each instance holds one subscription (a dedicated client) to its
//     channel and routes "<request id> <replica>" to the waiting Select.
//   - A waiter that gives up (client gone, QueueTimeout) runs the cancel
//     script: still queued → removed atomically (ctx.Err() or
//     ErrQueueTimeout); already handed a slot → on timeout it keeps the
//     slot (dispatched just in time), on cancellation it releases it at
//     once, which hands it to the next waiter. So does a waiter whose
//     body read (lb.Waiter) was cut at its deadline: see tellWaiting.
//
// Lost notifications: pub/sub is at-most-once, but a message is only lost
// when the subscription's connection breaks. On every (re)subscription the
// instance looks up all its waiters in {tag}:assigned once, and a waiter
// whose deadline passes without a message finds its slot through the
// cancel script; so a lost message costs at most that waiter's remaining
// QueueTimeout, never a slot.
//
// While the breaker is open (Redis down or slow) requests are not queued
// globally: Select falls back to this instance's own counts and sheds at
// MaxInflight as in the plain mode. Requests already waiting keep waiting
// until they are told or time out.
//
// Priority scheduling is not implemented: the queue is one FIFO list.

// ErrQueueTimeout: the request waited QueueTimeout in the global queue
// without getting a slot; answer 503.
// (errors.Is lb.ErrQueueTimeout).
var ErrQueueTimeout = fmt.Errorf("timed out waiting in the global queue: %w", lb.ErrQueueTimeout)

// errNoMemberLeft: the queue refused a waiter because none of its
// candidates is a member any more (see dispatchFn); errors.Is
// lb.ErrAllDown. Store.Pick picks again for such a request (from the
// set in force, or from this instance's own counts: see mismatchPick).
var errNoMemberLeft = fmt.Errorf("no replica this queued request may use is left in the pool: %w", lb.ErrAllDown)

// globalQueue is the queueing mode (see above).
type globalQueue struct {
	m        *member
	sub      rueidis.Client // the subscriber's own client
	waiters  waiterSet
	resub    chan struct{}         // identity changed: resubscribe
	subReady chan struct{}         // closed at the first subscription
	subOnce  sync.Once             // closes subReady
	subErr   atomic.Pointer[error] // an error reply to SUBSCRIBE (NOPERM)
	qwg      sync.WaitGroup        // waiting Selects, for Close

	queueLen                                            atomic.Int64 // as last read by kick
	queuedTotal, handovers, queueTimeouts, queueCancels atomic.Uint64
	wait                                                histo
}

func newGlobalQueue(m *member) *globalQueue {
	return &globalQueue{m: m, resub: make(chan struct{}, 1), subReady: make(chan struct{}),
		wait: histo{bounds: waitBuckets}}
}

// start subscribes to the instance's channel and, Redis reachable, waits
// (up to DialTimeout) for the subscription: not fatal when it does not
// come (a waiter told nothing still finds its slot: recheck at
// subscription, cancel script at its deadline), but Redis refusing it is
// configuration.
func (q *globalQueue) start(ctx context.Context) error {
	m := q.m
	cfg := m.conf()
	// The subscriber keeps a single-node client whatever happens: a
	// cluster delivers PUBLISH on every node, and this client redials by
	// itself when Redis comes back.
	sopt := m.conn.options()
	sopt.ForceSingleClient = true
	sub, err := rueidis.NewClient(sopt)
	if sub == nil {
		return fmt.Errorf("redis %v: %w", cfg.Addrs, err)
	}
	q.sub = sub
	m.wg.Add(1)
	go q.subscribe()
	if m.unreachableErr() != nil {
		return nil
	}
	t := time.NewTimer(cfg.DialTimeout)
	select {
	case <-q.subReady:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	if p := q.subErr.Load(); p != nil {
		select {
		case <-q.subReady:
		default: // Redis refused the subscription: configuration
			return fmt.Errorf("redis %v: subscribing to %s: %w", cfg.Addrs, m.k.notify(m.ident.Load().id), *p)
		}
	}
	return nil
}

// pick takes a free slot, or queues: the waiter listens before it asks,
// since the hand-over may be published before the script's reply arrives.
func (q *globalQueue) pick(ctx context.Context, candidates []string, onWait lb.Waiter) (*Lease, error) {
	m := q.m
	// Held from before the request can be queued until it has left the
	// queue (await's defer): Close waits for it before the connection
	// closes. Taken only in await, after the queueing script's reply and
	// the body read, a Close in between let the request leave the queue
	// over a closed connection: its records stayed in Redis, and the next
	// freed slot was handed to them.
	if !m.hold(&q.qwg) {
		return nil, lb.ErrShutdown
	}
	queued := false
	defer func() {
		if !queued {
			q.qwg.Done()
		}
	}()
	var tok string
	var wait chan string
	cands := strings.Join(candidates, candSep)
	m.own.mu.RLock() // not while it waits: reconcile keeps its waiters' records
	p, err := m.scriptPick(ctx, candidates, func(deadline time.Time, ident *identity, req string, args []string) rueidis.RedisResult {
		q.waiters.drop(tok) // an earlier try's
		tok = token(ident, req)
		wait = q.waiters.add(tok, cands)
		args = append(args, m.k.tag)
		args = append(args, candidates...)
		// Not cut short by the client: a reply lost to a cancellation
		// would leave the request queued (or holding a slot) until the
		// pending release is flushed; with the reply, await sees ctx done
		// and leaves the queue at once.
		return m.callUntil(context.WithoutCancel(ctx), deadline, func(ctx context.Context) rueidis.RedisResult {
			return selectQueueScript.Exec(ctx, m.rc(),
				[]string{m.k.load, ident.alive, ident.inst, m.k.insts, m.k.queue, m.k.waiters, m.k.assigned, m.k.cands, m.k.idle}, args)
		})
	})
	if err == nil && p.code == pickQueued {
		queued = true // await lets go of the hold
		m.own.mu.RUnlock()
		start := time.Now() // the wait counts from the queueing, not after the body read
		cut := notCut
		if onWait != nil {
			cut = q.tellWaiting(ctx, onWait, start)
		}
		return q.await(ctx, p.ident, p.req, wait, start, cut)
	}
	defer m.own.mu.RUnlock()
	q.waiters.drop(tok)
	if err != nil {
		return nil, err
	}
	return m.leaseFor(p, candidates)
}

// tellWaiting tells onWait that the pick waits, on the pick's goroutine
// (the adapter reads the client's body then). The queue's end is only
// known in await, after it; so the context onWait gets ends at what would
// end the wait there while nothing can be handed over yet: the queue
// deadline (queueTimer), the request's context, Close. It returns why it
// ended while onWait was still busy (the read may have been cut, so the
// pick must not be dispatched: see await), or notCut if onWait returned
// first. The context never ends once onWait has returned.
func (q *globalQueue) tellWaiting(ctx context.Context, onWait lb.Waiter, start time.Time) giveUpReason {
	left, leave := context.WithCancel(context.Background()) // not ctx's child: ctx ends after a dispatch too
	var mu sync.Mutex
	returned, cut := false, notCut
	end := func(why giveUpReason) {
		mu.Lock()
		defer mu.Unlock()
		if !returned {
			cut = why
			leave()
		}
	}
	over := make(chan struct{})
	go func() {
		qt := q.newQueueTimer(start)
		defer qt.Stop()
		for {
			select {
			case <-qt.C:
				end(gaveUpTimeout)
			case <-ctx.Done():
				end(gaveUpCancelled)
			case <-q.m.done:
				end(gaveUpClosed)
			case <-qt.changed:
				qt.reconfigured()
				continue
			case <-over:
			}
			return
		}
	}()
	onWait.Waiting(left)
	mu.Lock()
	returned = true
	mu.Unlock()
	close(over)
	return cut
}

// queueTimer fires at a queued request's deadline: its arrival plus
// queue_timeout, which a reload changes for the requests already waiting
// too (reconfigured, on changed).
type queueTimer struct {
	*time.Timer
	m       *member
	start   time.Time
	changed <-chan struct{}
}

func (q *globalQueue) newQueueTimer(start time.Time) *queueTimer {
	changed := q.m.confChanged() // before conf: no change in between is missed
	return &queueTimer{Timer: time.NewTimer(time.Until(start.Add(q.m.conf().QueueTimeout))), m: q.m, start: start, changed: changed}
}

func (qt *queueTimer) reconfigured() {
	qt.changed = qt.m.confChanged()
	qt.Reset(time.Until(qt.start.Add(qt.m.conf().QueueTimeout)))
}

// candSep separates a waiter's candidates in {tag}:cands (no replica
// address holds a newline); selectQueueScript joins them with it too.
const candSep = "\n"

// waiterSet routes hand-over notifications to the waiting Selects, and
// keeps what reconcile needs to queue one again (its candidates).
type waiterSet struct {
	mu sync.Mutex
	m  map[string]waiter // by token
}

type waiter struct {
	ch    chan string // the replica handed over (buffered 1)
	cands string      // as queued: its candidates joined by candSep
}

func (w *waiterSet) add(tok, cands string) chan string {
	ch := make(chan string, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string]waiter{}
	}
	w.m[tok] = waiter{ch, cands}
	w.mu.Unlock()
	return ch
}

// requeued moves the waiter old to the token tok, with new candidates
// (requeue); the old token's deliveries are dropped from now on.
func (w *waiterSet) requeued(old, tok, cands string) chan string {
	ch := make(chan string, 1)
	w.mu.Lock()
	delete(w.m, old)
	w.m[tok] = waiter{ch, cands}
	w.mu.Unlock()
	return ch
}

func (w *waiterSet) cands(tok string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.m[tok].cands
}

func (w *waiterSet) drop(tok string) {
	w.mu.Lock()
	delete(w.m, tok)
	w.mu.Unlock()
}

// deliver hands rep to the waiter tok, if it still waits; duplicates
// (notification and recheck) are dropped.
func (w *waiterSet) deliver(tok, rep string) {
	w.mu.Lock()
	ch := w.m[tok].ch
	w.mu.Unlock()
	if ch != nil {
		select {
		case ch <- rep:
		default:
		}
	}
}

func (w *waiterSet) tokens() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.m))
	for tok := range w.m {
		out = append(out, tok)
	}
	return out
}

// of lists the waiters whose token starts with prefix (an identity's) as
// (request id, candidates) pairs.
func (w *waiterSet) of(prefix string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for tok, wt := range w.m {
		if req, ok := strings.CutPrefix(tok, prefix); ok {
			out = append(out, req, wt.cands)
		}
	}
	return out
}

func (w *waiterSet) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m)
}

func token(ident *identity, req string) string { return ident.id + ":" + req }

type giveUpReason int

const (
	gaveUpTimeout giveUpReason = iota
	gaveUpCancelled
	gaveUpClosed
	notCut giveUpReason = -1 // tellWaiting: its Waiter returned first
)

// await waits for the queued request's slot: a notification, or, at
// ctx done / QueueTimeout / Close, the cancel script's verdict. start is
// when the request was queued (its wait and timeout count from then).
// cut (unless notCut) is why its Waiter's context ended during the body read
// (tellWaiting): it leaves the queue for that reason at once, and gives
// back a slot handed over meanwhile (the read may have been cut). It
// holds qwg (taken in pick) and lets go of it once the request left.
func (q *globalQueue) await(ctx context.Context, ident *identity, req string, ch chan string, start time.Time, cut giveUpReason) (*Lease, error) {
	m := q.m
	tok := token(ident, req)
	q.queuedTotal.Add(1)
	defer q.qwg.Done()
	if cut != notCut {
		return q.giveUp(ctx, ident, req, start, cut, true)
	}
	// The deadline follows queue_timeout: a reload that changes it
	// reaches the requests already waiting (counted from their arrival).
	t := q.newQueueTimer(start)
	defer t.Stop()
	for {
		select {
		case rep := <-ch:
			if rep == "" { // refused by the queue, which left a tombstone (dispatchFn)
				q.waiters.drop(tok)
				m.tombs.add(ident, []string{req}, time.Now())
				return nil, errNoMemberLeft
			}
			for {
				l, next, err := q.admitHanded(ident, req, tok, rep, start)
				if next == nil {
					return l, err
				}
				req, tok, ch = next.req, token(ident, next.req), next.ch
				if rep = next.addr; rep == "" {
					break // back in its place: wait on
				}
			}
		case <-ctx.Done():
			return q.giveUp(ctx, ident, req, start, gaveUpCancelled, false)
		case <-t.C:
			return q.giveUp(ctx, ident, req, start, gaveUpTimeout, false)
		case <-m.done:
			return q.giveUp(ctx, ident, req, start, gaveUpClosed, false)
		case <-t.changed:
			t.reconfigured()
		}
	}
}

// requeued is a waiter put back in its place under a new request id
// (requeue): addr is the slot the queue handed it at once, "" if none.
type requeued struct {
	req, addr string
	ch        chan string
}

// admitHanded takes the slot rep the queue handed the waiter req if
// passive health lets it (admit; the lease carries the health lease);
// refused, the waiter goes back to its place in the queue less rep
// (requeue): next says under which request id it waits now. A waiter
// whose last candidate this was ends with lb.ErrAllDown, the slot
// released.
func (q *globalQueue) admitHanded(ident *identity, req, tok, rep string, start time.Time) (*Lease, *requeued, error) {
	m := q.m
	hl := m.health.AcquireUsable(rep, 0)
	if hl == nil {
		if _, known := m.health.View(rep, time.Time{}); !known {
			return q.handed(ident, req, tok, rep, start), nil, nil // no health to keep
		}
		return q.requeue(ident, req, tok, rep)
	}
	l := q.handed(ident, req, tok, rep, start)
	l.hl = hl
	return l, nil, nil
}

// requeue puts the waiter req, handed rep which its health refused, back
// in its place in the queue without rep (requeueQueueScript), under a new
// request id so that a late copy of the old hand-over (recheck) cannot
// reach it.
func (q *globalQueue) requeue(ident *identity, req, tok, rep string) (*Lease, *requeued, error) {
	m := q.m
	var cands []string
	for _, c := range strings.Split(q.waiters.cands(tok), candSep) {
		if c != rep && c != "" {
			cands = append(cands, c)
		}
	}
	m.own.mu.RLock()
	if cands = m.healthy(cands); len(cands) == 0 {
		// nothing left to wait for: the slot goes to the next waiter
		q.waiters.drop(tok)
		l := m.lease(rep, ident, req)
		m.own.mu.RUnlock()
		l.Release(lb.Outcome{Kind: lb.Cancelled})
		return nil, nil, lb.ErrAllDown
	}
	defer m.own.mu.RUnlock()
	floor := ident.acked.Load()
	next := strconv.FormatUint(m.seq.Add(1), 36)
	ch := q.waiters.requeued(tok, token(ident, next), strings.Join(cands, candSep))
	args := append([]string{strconv.Itoa(m.conf().MaxInflight), m.k.tag, ident.id, req, rep, next}, cands...)
	res := m.call(context.Background(), func(ctx context.Context) rueidis.RedisResult {
		return requeueQueueScript.Exec(ctx, m.rc(),
			[]string{m.k.load, m.k.gone, ident.inst, m.k.queue, m.k.waiters, m.k.assigned, m.k.cands, m.k.idle}, args)
	})
	arr, err := res.ToArray()
	if err == nil && len(arr) != 3 {
		err = errBadReply
	}
	if err != nil {
		// Unknown whether it ran: the lost-select releases end the old
		// request's slot and take the new one out of the queue (or
		// release what it was handed) once Redis answers; this request
		// is served from this instance's own counts, as any pick Redis
		// does not answer.
		q.waiters.drop(token(ident, next))
		m.queueRelease(ident, req)
		m.queueRelease(ident, "?"+next)
		l, err := m.fallback(cands)
		return l, nil, err
	}
	m.noteVersion(ident, floor, versionOf(arr, 2))
	code, _ := arr[0].AsInt64()
	addr, _ := arr[1].ToString()
	switch code {
	case pickLeased:
		return nil, &requeued{req: next, addr: addr, ch: ch}, nil
	case pickQueued:
		return nil, &requeued{req: next, ch: ch}, nil
	}
	// 2: the slot was no longer its own (reaped: its identity was taken
	// for dead); 3: refused, none of its candidates a member any more.
	// Either way it picks again, as a new request (Store.Pick).
	q.waiters.drop(token(ident, next))
	if code == 3 {
		m.tombs.add(ident, []string{next}, time.Now())
	}
	return nil, nil, errNoMemberLeft
}

// handed makes the lease of a slot the queue gave this request: from
// waiter to lease at once for reconcile, which keeps the records of both.
func (q *globalQueue) handed(ident *identity, req, tok, rep string, start time.Time) *Lease {
	q.m.own.mu.RLock()
	defer q.m.own.mu.RUnlock()
	return q.handedLocked(ident, req, tok, rep, start)
}

// handedLocked is handed with own.mu read-held.
func (q *globalQueue) handedLocked(ident *identity, req, tok, rep string, start time.Time) *Lease {
	q.waiters.drop(tok)
	q.wait.observe(time.Since(start))
	q.handovers.Add(1)
	l := q.m.lease(rep, ident, req)
	l.why = lb.ReasonQueued
	return l
}

// giveUp takes the waiter out of the queue, or claims the slot it was
// handed meanwhile: under own.mu, so that reconcile never queues again a
// waiter that is leaving. A slot claimed is kept (dispatched just in
// time) unless its client left or its body read was cut (cut): then it
// goes to the next waiter, and the request gets why's refusal.
func (q *globalQueue) giveUp(ctx context.Context, ident *identity, req string, start time.Time, why giveUpReason, cut bool) (*Lease, error) {
	m := q.m
	tok := token(ident, req)
	m.own.mu.RLock()
	floor := ident.acked.Load()
	res := m.call(context.Background(), func(ctx context.Context) rueidis.RedisResult {
		return cancelQueueScript.Exec(ctx, m.rc(), []string{m.k.queue, m.k.waiters, m.k.assigned, m.k.cands, ident.inst}, []string{tok, m.k.tag})
	})
	arr, err := res.ToArray()
	if err == nil && len(arr) != 3 {
		err = errBadReply
	}
	code := int64(-1)
	var rep string
	if err == nil {
		m.noteVersion(ident, floor, versionOf(arr, 2))
		code, _ = arr[0].AsInt64()
		rep, _ = arr[1].ToString()
	}
	var l *Lease
	if code == 1 {
		l = q.handedLocked(ident, req, tok, rep, start)
	} else {
		q.waiters.drop(tok)
	}
	m.own.mu.RUnlock()
	if err != nil {
		// Unknown whether it is still queued or was handed a slot: the
		// lost-select release takes it out of the queue, or releases the
		// slot, once Redis answers.
		m.queueRelease(ident, "?"+req)
	}
	if l != nil {
		if why == gaveUpCancelled || cut {
			l.Release(lb.Outcome{Kind: lb.Cancelled}) // hands it to the next waiter
		} else if m.admit(l) {
			return l, nil // dispatched just in time
		}
		// refused by health (admit released it): the request does not
		// queue again for another QueueTimeout
	}
	switch why {
	case gaveUpCancelled:
		q.queueCancels.Add(1)
		return nil, ctx.Err()
	case gaveUpClosed:
		return nil, lb.ErrShutdown
	}
	q.queueTimeouts.Add(1)
	return nil, ErrQueueTimeout
}

// subscribe keeps this instance's notification channel subscribed (one
// dedicated client, one long-lived SUBSCRIBE), resubscribing after a
// broken connection or an identity rotation, until Close.
func (q *globalQueue) subscribe() {
	m := q.m
	defer m.wg.Done()
	defer q.sub.Close()
	for {
		ident := m.ident.Load()
		ctx, cancel := context.WithCancel(context.Background())
		confirmed := make(chan struct{}, 1)
		hctx := rueidis.WithOnSubscriptionHook(ctx, func(ps rueidis.PubSubSubscription) {
			if ps.Kind == "subscribe" {
				select {
				case confirmed <- struct{}{}:
				default:
				}
			}
		})
		errc := make(chan error, 1)
		go func() {
			errc <- q.sub.Receive(hctx, q.sub.B().Subscribe().Channel(m.k.notify(ident.id)).Build(),
				func(msg rueidis.PubSubMessage) {
					if req, rep, ok := strings.Cut(msg.Message, " "); ok {
						q.waiters.deliver(token(ident, req), rep)
					}
				})
		}()
		done, rotated := m.done, q.resub
	wait:
		for {
			select {
			case <-confirmed:
				q.subOnce.Do(func() { close(q.subReady) })
				q.recheck()
			case <-rotated:
				rotated = nil
				cancel()
			case <-done:
				done = nil
				cancel()
			case err := <-errc:
				if _, isReply := rueidis.IsRedisErr(err); isReply {
					q.subErr.Store(&err) // NOPERM: New reports it
				}
				break wait
			}
		}
		failed := ctx.Err() == nil
		cancel()
		select {
		case <-m.done:
			return
		default:
		}
		if failed && !backoffSleep(m.done, min(m.conf().BreakerBackoff, 250*time.Millisecond)) {
			return
		}
	}
}

// recheck looks every waiter up in {tag}:assigned once: a hand-over
// published while the subscription was down is found here.
func (q *globalQueue) recheck() {
	m := q.m
	toks := q.waiters.tokens()
	if len(toks) == 0 {
		return
	}
	res := m.call(context.Background(), func(ctx context.Context) rueidis.RedisResult {
		return m.rc().Do(ctx, m.rc().B().Hmget().Key(m.k.assigned).Field(toks...).Build())
	})
	vals, err := res.ToArray()
	if err != nil {
		return
	}
	for i, v := range vals {
		if rep, err := v.ToString(); err == nil && i < len(toks) {
			q.waiters.deliver(toks[i], rep)
		}
	}
}

// maintain drops this instance's orphaned records (sweep), dispatches
// whatever is free (slots freed by a reap, an outage, a raised
// max_inflight) and refreshes the queue gauge.
func (q *globalQueue) maintain(ctx context.Context) {
	m := q.m
	q.sweep(ctx)
	res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return kickQueueScript.Exec(ctx, m.rc(), []string{m.k.queue, m.k.waiters, m.k.load},
			[]string{strconv.Itoa(m.conf().MaxInflight), m.k.tag})
	})
	if arr, err := res.ToArray(); err == nil && len(arr) == 3 {
		n, _ := arr[2].AsInt64()
		q.queueLen.Store(n)
	}
}

// sweep releases the records of this instance that are orphans: of a
// request it neither holds a lease for nor waits for. The queue makes
// them when it hands a slot to a token of this instance that is dead
// here: a waiter a rollback put back in the queue after the instance
// reconciled, or that reconcile kept because it was still waiting then,
// though it had already left with a hand-over Redis lost. Nothing else
// would ever release that slot (no waiter looks for it, and only a
// version regression starts a reconcile), so every round the instance
// reads its hash and releases what it does not know. The check is
// repeated under own.mu (write-held): no one-call pick or release of the
// instance is under way then, and a waiter becomes a lease under it, so
// a record whose request is neither held nor waiting has nobody to end
// it. The release script is idempotent: a release of the same request
// still pending later changes nothing.
func (q *globalQueue) sweep(ctx context.Context) {
	m := q.m
	ident := m.ident.Load()
	res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return m.rc().Do(ctx, m.rc().B().Hgetall().Key(ident.inst).Build())
	})
	kv, err := res.AsStrMap()
	if err != nil {
		return
	}
	orphans := q.orphans(ident, kv)
	if len(orphans) == 0 {
		return
	}
	m.own.mu.Lock()
	defer m.own.mu.Unlock()
	if orphans = q.orphans(ident, kv); len(orphans) > 0 {
		_ = m.execRelease(ctx, ident, orphans) // failed: the next round tries again
	}
}

// orphans lists the requests recorded in kv (an instance hash) that ident
// neither holds a lease for nor waits for.
func (q *globalQueue) orphans(ident *identity, kv map[string]string) []string {
	known := map[string]bool{}
	held := q.m.own.snapshot(ident)
	for i := 0; i < len(held); i += 2 {
		known[held[i]] = true
	}
	waiting := q.waiters.of(ident.id + ":")
	for i := 0; i < len(waiting); i += 2 {
		known[waiting[i]] = true
	}
	var out []string
	for id, rep := range kv {
		if id != "#" && id != "!" && rep != "" && !known[id] {
			out = append(out, id)
		}
	}
	return out
}

// The queue's scripts dispatch what a release, a reap or a new member
// frees to the waiters in the same step.

func (q *globalQueue) execRelease(ctx context.Context, ident *identity, ids []string) rueidis.RedisResult {
	m := q.m
	args := make([]string, 0, 3+len(ids))
	args = append(args, strconv.Itoa(m.conf().MaxInflight), m.k.tag, ident.id)
	args = append(args, ids...)
	return releaseQueueScript.Exec(ctx, m.rc(),
		[]string{m.k.load, m.k.gone, ident.inst, m.k.queue, m.k.waiters, m.k.assigned, m.k.cands}, args)
}

func (q *globalQueue) execReap(ctx context.Context, id string) rueidis.RedisResult {
	m := q.m
	return reapQueueScript.Exec(ctx, m.rc(),
		[]string{m.k.load, m.k.gone, m.k.alive(id), m.k.inst(id), m.k.insts, m.k.assigned},
		[]string{id, strconv.Itoa(m.conf().MaxInflight), m.k.tag})
}

func (q *globalQueue) execSync(ctx context.Context, ident *identity, replicas []string) rueidis.RedisResult {
	m := q.m
	args := append([]string{strconv.Itoa(m.conf().MaxInflight), m.k.tag}, replicas...)
	return syncQueueScript.Exec(ctx, m.rc(), []string{m.k.load, m.k.gone, m.k.queue, ident.inst}, args)
}

func (q *globalQueue) release(l *Lease) { q.m.releaseRecorded(l) }

func (q *globalQueue) drain() {} // the queue keeps nothing beyond the member's pending releases

func (q *globalQueue) quiesce(fn func()) { fn() } // nothing kept: see drain

// execReconcile keeps the records of the requests still waiting here (a
// hand-over on its way), queues again those Redis lost, and takes the
// others of this instance out of the queue.
func (q *globalQueue) execReconcile(ctx context.Context, ident *identity, floor int64, held []string) rueidis.RedisResult {
	m := q.m
	waiting := q.waiters.of(ident.id + ":")
	args := append(m.reconcileArgs(ident, floor), strconv.Itoa(m.conf().MaxInflight), m.k.tag, strconv.Itoa(len(waiting)/2))
	args = append(append(args, waiting...), held...)
	return reconcileQueueScript.Exec(ctx, m.rc(),
		[]string{m.k.load, m.k.gone, ident.alive, ident.inst, m.k.insts, m.k.queue, m.k.waiters, m.k.assigned, m.k.cands, m.k.idle}, args)
}

// rotated resubscribes under the new identity.
func (q *globalQueue) rotated() {
	select {
	case q.resub <- struct{}{}:
	default:
	}
}

// stop waits for the waiting Selects to leave the queue (or keep their
// slot): Close closed done, which ends their waits and cuts their body
// reads (tellWaiting). A read nothing cuts (a Waiter without the client's
// connection) is not waited for past closeWait: that request leaves the
// queue when its read ends, or the reapers take its records.
func (q *globalQueue) stop() {
	left := make(chan struct{})
	go func() {
		q.qwg.Wait()
		close(left)
	}()
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-left:
	case <-t.C:
	}
}

// closeWait bounds how long Close waits for the queued requests to leave.
const closeWait = 5 * time.Second

func (q *globalQueue) stats(st *Stats) {
	wcum, wcount, wsum := q.wait.snapshot()
	st.Queueing, st.Queued, st.Waiting = true, q.queueLen.Load(), q.waiters.len()
	st.QueuedTotal, st.Handovers = q.queuedTotal.Load(), q.handovers.Load()
	st.QueueTimeouts, st.QueueCancels = q.queueTimeouts.Load(), q.queueCancels.Load()
	st.WaitBuckets, st.WaitBucketCounts, st.WaitCount, st.WaitSum = waitBuckets, wcum, wcount, wsum
}
