package flow

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluice-router/sluice/flow/policies"
)

// Controller is one pool's flow control: its bands and queues, in-flight
// accounting and dispatch. It outlives config reloads (see Reconfigure).
//
// Dispatch is event-driven under the one mutex, as in lb/qll: every event
// that can open the gate or add work (an enqueue, a release, a reload)
// runs the dispatch loop before it unlocks, so no request waits for a
// dispatcher goroutine to be scheduled and there is no second place where
// state changes. The only goroutine is a poller that asks the detector
// again every PollInterval, and whenever the detector's answer says it may
// have changed (Verdict.Recheck), because a detector's answer can change
// without any event the controller sees: replicas report their own load,
// other instances give capacity back.
type Controller struct {
	mu     sync.Mutex
	cfg    Config
	det    SaturationDetector
	clock  Clock
	bands  []*band // highest priority first
	byPrio map[int]*band
	queued int   // requests waiting, all bands
	bytes  int64 // their bytes
	tokens int64 // their estimated tokens
	// verdict is the detector's last answer (band limits and the poller
	// read it).
	verdict Verdict
	// feed, if set, is where the demand is published (see demand.go);
	// perFlow then counts what each flow has in flight, nil otherwise.
	feed     *DemandFeed
	perFlow  map[FlowKey]*InFlight
	inFlight InFlight
	seq      uint64
	closed   bool
	counters Counters
	observer Observer

	stop   chan struct{} // closed by Close: ends the poller
	polled chan struct{} // closed when the poller has returned
	retune chan struct{} // a reload changed the poll interval or the detector
}

// band is one priority level: its flows, each a queue, and its totals.
type band struct {
	cfg      BandConfig
	ordering policies.OrderingPolicy
	fairness policies.FairnessPolicy
	flows    map[string]*policies.Queue // only backlogged flows
	queued   int
	bytes    int64
}

// Counters are totals since the controller was created. Every request
// counts once in Received and once in exactly one outcome, so Received is
// the sum of the six outcome counters once nothing is queued.
type Counters struct {
	Received uint64

	Dispatched              uint64
	RejectedCapacity        uint64
	RejectedOther           uint64 // arrived after Close
	EvictedTTL              uint64
	EvictedContextCancelled uint64 // includes requests whose ctx was done on arrival
	EvictedOther            uint64 // queued at Close, or its Queued hook panicked

	// Released counts Ticket.Release calls; Dispatched-Released is in flight.
	Released uint64
}

func (n *Counters) count(o Outcome) {
	switch o {
	case Dispatched:
		n.Dispatched++
	case RejectedCapacity:
		n.RejectedCapacity++
	case RejectedOther:
		n.RejectedOther++
	case EvictedTTL:
		n.EvictedTTL++
	case EvictedContextCancelled:
		n.EvictedContextCancelled++
	case EvictedOther:
		n.EvictedOther++
	}
}

// Option adjusts a new controller.
type Option func(*Controller)

// WithClock replaces the real clock (tests).
func WithClock(c Clock) Option { return func(ctl *Controller) { ctl.clock = c } }

// New returns a controller gated by det. cfg is validated and defaulted.
func New(cfg Config, det SaturationDetector, opts ...Option) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if det == nil {
		return nil, fmt.Errorf("flow: a saturation detector is required")
	}
	c := &Controller{
		cfg:      cfg.WithDefaults(),
		det:      det,
		clock:    realClock{},
		byPrio:   map[int]*band{},
		observer: nopObserver{},
		stop:     make(chan struct{}),
		polled:   make(chan struct{}),
		retune:   make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(c)
	}
	if c.feed != nil {
		c.perFlow = map[FlowKey]*InFlight{}
	}
	for _, b := range c.cfg.Bands {
		c.addBandLocked(b)
	}
	c.askLocked()
	// Linked to its feed last: the feed's reader (a gate's own goroutine)
	// reads the controller under its lock as soon as it is linked, and
	// what New made so far was made without it.
	if c.feed != nil && !c.feed.ctl.CompareAndSwap(nil, c) {
		return nil, fmt.Errorf("flow: the demand feed already has a controller publishing to it")
	}
	go c.poll()
	return c, nil
}

// SetObserver installs the metrics hooks (nil removes them).
func (c *Controller) SetObserver(o Observer) {
	if o == nil {
		o = nopObserver{}
	}
	c.mu.Lock()
	c.observer = o
	c.mu.Unlock()
}

// Enqueue blocks until the request may proceed or is refused. With a
// ticket the caller proxies the request and must call Release once it
// ends; the ticket is returned even if ctx ended in the instant it was
// dispatched. Otherwise the error is ErrCapacity, ErrTTL, ErrShutdown, or
// ctx.Err() if the client went away while queued.
func (c *Controller) Enqueue(ctx context.Context, req Request) (*Ticket, error) {
	start := time.Now()
	req.Bytes, req.Tokens = max(req.Bytes, 0), max(req.Tokens, 0)
	c.mu.Lock()
	arrival := c.clock.Now()
	c.counters.Received++
	obs := c.observer
	queued := c.queued
	refuse := func(o Outcome, err error) (*Ticket, error) {
		c.counters.count(o)
		if c.queued != queued { // the dispatch below let some in
			c.publishLocked()
		}
		c.mu.Unlock()
		obs.Enqueued(&req, o.String(), time.Since(start))
		obs.Finished(&req, o, 0)
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return refuse(EvictedContextCancelled, err)
	}
	if c.closed {
		return refuse(RejectedOther, ErrShutdown)
	}
	// Those waiting go first, and the gate may have opened since the last
	// event (a replica's metrics, another instance): dispatch before the
	// limits are checked, or a band full only of requests the open gate
	// would take refuses the arrival until the next poll.
	c.dispatchLocked()
	// Work-conserving: nobody waits and the pool has room, so go at once.
	if c.queued == 0 && !saturated(c.askLocked().Load) {
		t := c.admitLocked(&req, 0)
		c.counters.count(Dispatched)
		c.publishLocked()
		c.mu.Unlock()
		obs.Enqueued(&req, Dispatched.String(), time.Since(start))
		obs.Finished(&req, Dispatched, 0)
		return t, nil
	}
	b := c.bandLocked(req.Priority)
	if !c.fitsLocked(b, req.Bytes) {
		// Push out one request of a flooding flow, only if that makes room:
		// never refuse someone without admitting the newcomer.
		victim := c.pushOutVictimLocked(b, req.FlowID)
		if victim == nil || !c.fitsWithoutLocked(b, req.Bytes, victim) {
			return refuse(RejectedCapacity, ErrCapacity)
		}
		victim.err = ErrCapacity
		c.resolveLocked(victim, RejectedCapacity)
	}
	// The gate was closed at the last ask, just above: w waits.
	w := c.pushLocked(b, req, arrival)
	w.timer = c.clock.AfterFunc(w.item.Deadline.Sub(arrival), func() { c.evict(w, EvictedTTL, nil) })
	var left context.Context
	if req.Queued != nil {
		left, w.leave = context.WithCancel(context.Background())
	}
	c.publishLocked()
	c.mu.Unlock()
	obs.Enqueued(&req, "Queued", time.Since(start))
	if req.Queued != nil {
		c.runQueuedHook(w, func() { req.Queued(left) })
	}

	select {
	case <-w.done:
	case <-ctx.Done():
		c.evict(w, EvictedContextCancelled, ctx.Err())
		<-w.done // resolved now, by us or by whoever came first
	}
	waited := c.clock.Now().Sub(arrival)
	if w.ticket != nil {
		waited = w.ticket.Waited
	}
	obs.Finished(&req, w.outcome, waited)
	if w.outcome == Dispatched {
		return w.ticket, nil
	}
	return nil, w.err
}

// runQueuedHook runs a queued request's hook. If it panics, the request
// leaves the queue, or gives back the slot it was dispatched meanwhile,
// before the panic goes on: nobody would ever release it otherwise, and
// the pool would run a slot short for good.
func (c *Controller) runQueuedHook(w *waiter, hook func()) {
	ok := false
	defer func() {
		if !ok {
			c.evict(w, EvictedOther, ErrShutdown)
			if w.ticket != nil { // read after evict's lock: set under it
				w.ticket.Release()
			}
		}
	}()
	hook()
	ok = true
}

// evict takes w out of its queue with outcome o unless something else
// resolved it first: whichever transition takes the lock first wins.
func (c *Controller) evict(w *waiter, o Outcome, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !w.resolved {
		w.err = err
		c.resolveLocked(w, o)
		c.publishLocked()
	}
}

// pushOutVictimLocked picks whom a full band refuses instead of a newcomer
// from flow id: the newest request of the band's largest flow, if that flow
// holds at least two more requests than the newcomer's would. Capacity
// limits are per band, so without this a flooding tenant that fills the
// band would have every other tenant's arrivals refused: fairness must hold
// at admission too, not only at dispatch. nil: refuse the newcomer.
func (c *Controller) pushOutVictimLocked(b *band, id string) *waiter {
	mine := 0
	if q := b.flows[id]; q != nil {
		mine = q.Len()
	}
	var largest *policies.Queue
	for fid, q := range b.flows {
		if fid != id && (largest == nil || q.Len() > largest.Len()) {
			largest = q
		}
	}
	if largest == nil || largest.Len() < mine+2 {
		return nil
	}
	var newest *policies.Item
	largest.Each(func(it *policies.Item) {
		if newest == nil || it.Seq > newest.Seq {
			newest = it
		}
	})
	return newest.Value.(*waiter)
}

// fitsWithoutLocked is fitsLocked as if v (queued in band b) were gone.
func (c *Controller) fitsWithoutLocked(b *band, n int64, v *waiter) bool {
	g := &c.cfg
	switch {
	case g.MaxRequests > 0 && int64(c.queued-1) >= c.globalLimitLocked(),
		g.MaxBytes > 0 && over(c.bytes-v.req.Bytes, n, g.MaxBytes),
		int64(b.queued-1) >= c.bandLimitLocked(b),
		over(b.bytes-v.req.Bytes, n, b.cfg.MaxBytes):
		return false
	}
	return true
}

// fitsLocked checks the global and band limits for one more request of n
// bytes.
func (c *Controller) fitsLocked(b *band, n int64) bool {
	g := &c.cfg
	switch {
	case g.MaxRequests > 0 && int64(c.queued) >= c.globalLimitLocked(),
		g.MaxBytes > 0 && over(c.bytes, n, g.MaxBytes),
		int64(b.queued) >= c.bandLimitLocked(b),
		over(b.bytes, n, b.cfg.MaxBytes):
		return false
	}
	return true
}

// over reports whether used + n bytes exceed limit (all ≥ 0). n is a
// client's Content-Length, up to math.MaxInt64: used + n could wrap
// below the limit, admitting the request and leaving the count negative
// (every later request would then fit), so compare without adding.
func over(used, n, limit int64) bool { return n > limit-used }

// bandLimitLocked is band b's queue limit in requests now: a default
// limit follows the pool's capacity, so it grows and shrinks with the
// replica count.
func (c *Controller) bandLimitLocked(b *band) int64 {
	return c.queuePartLocked(BandQueueLimit(b.cfg, c.capacityLocked()))
}

// queuePartLocked is this instance's part of a pool-wide queue limit n:
// n itself unless the pool's count is shared by several instances. Never
// fewer than the default floor: a queue of a few requests would let a
// flood crowd out a quiet tenant that has two waiting (a push-out needs
// the flood to hold two more).
func (c *Controller) queuePartLocked(n int64) int64 {
	if part := c.verdict.QueueShare; part > 0 && part < 1 {
		n = max(int64(math.Ceil(float64(n)*part)), min(n, DefaultBandMinRequests))
	}
	return n
}

// globalLimitLocked is the global max_requests for this instance's queue
// now: with the pool's count shared by several instances, its part of it,
// as for a band's (bandLimitLocked); the GIE partitions its global limit
// over its shards the same way. Whole, each of N instances queued N× the
// pool's limit.
func (c *Controller) globalLimitLocked() int64 { return c.queuePartLocked(c.cfg.MaxRequests) }

// capacityLocked is the pool's capacity in requests: the detector's if it
// knows it, else what is in flight (a queue forms only once the pool is
// full, so that is what the pool holds).
func (c *Controller) capacityLocked() int64 {
	if n := c.verdict.Capacity; n > 0 {
		return n
	}
	return max(c.inFlight.Requests, 1)
}

// askLocked asks the detector about the pool now and keeps the answer.
func (c *Controller) askLocked() Verdict {
	c.verdict = c.det.Saturation(c.inFlight)
	return c.verdict
}

func (c *Controller) pushLocked(b *band, req Request, arrival time.Time) *waiter {
	c.seq++
	ttl := b.cfg.TTL
	if req.TTL > 0 {
		ttl = req.TTL
	}
	w := &waiter{req: req, done: make(chan struct{})}
	w.item = policies.Item{Seq: c.seq, Arrival: arrival, Deadline: arrival.Add(ttl), Value: w}
	if req.SLOTTFT > 0 {
		w.item.SLODeadline = arrival.Add(req.SLOTTFT)
	}
	c.insertLocked(b, w)
	return w
}

// insertLocked puts an unqueued waiter into band b.
func (c *Controller) insertLocked(b *band, w *waiter) {
	q := b.flows[w.req.FlowID]
	if q == nil {
		q = policies.NewQueue(w.req.FlowID, b.ordering)
		b.flows[w.req.FlowID] = q
	}
	w.band, w.queue = b, q
	q.Push(&w.item)
	b.fairness.Update(q, false)
	b.queued++
	b.bytes += w.req.Bytes
	c.queued++
	c.bytes += w.req.Bytes
	c.tokens += w.req.Tokens
}

// removeLocked takes a queued waiter out of its band.
func (c *Controller) removeLocked(w *waiter, served bool) {
	b, q := w.band, w.queue
	q.Remove(&w.item)
	b.fairness.Update(q, served)
	if q.Len() == 0 {
		delete(b.flows, q.ID) // idle tenants cost nothing
	}
	b.queued--
	b.bytes -= w.req.Bytes
	c.queued--
	c.bytes -= w.req.Bytes
	c.tokens -= w.req.Tokens
}

// resolveLocked ends a queued request with outcome o. It is the only place
// a waiter leaves the queue, and it does so exactly once.
func (c *Controller) resolveLocked(w *waiter, o Outcome) {
	if w.resolved {
		return
	}
	w.resolved, w.outcome = true, o
	c.removeLocked(w, o == Dispatched)
	if w.timer != nil {
		w.timer.Stop() // if it already fired, its evict finds w resolved
	}
	if o == Dispatched {
		w.ticket = c.admitLocked(&w.req, c.clock.Now().Sub(w.item.Arrival))
	} else {
		if w.err == nil {
			w.err = o.err()
		}
		if w.leave != nil {
			// Its Queued hook may be waiting on a client (a body read):
			// the refusal must not wait for it. A cancel only starts its
			// callbacks' goroutines: nothing of the hook's runs under c.mu.
			w.leave()
		}
	}
	c.counters.count(o)
	close(w.done)
}

// admitLocked counts a dispatched request in flight.
func (c *Controller) admitLocked(req *Request, waited time.Duration) *Ticket {
	c.inFlight.Requests++
	c.inFlight.Tokens += req.Tokens
	k := FlowKey{req.Priority, req.FlowID}
	c.countFlowLocked(k, req.Tokens, 1)
	return &Ticket{c: c, tokens: req.Tokens, flow: k, Waited: waited}
}

// dispatchLocked releases waiting requests, highest band first, the band's
// fairness policy choosing the flow and the flow's ordering the request,
// until the queues are empty or the pool is saturated. When saturated it
// stops outright (head-of-line blocking): a lower band never goes ahead of
// a higher one that is waiting.
func (c *Controller) dispatchLocked() {
	if c.queued == 0 {
		return
	}
	start := time.Now()
	for c.queued > 0 {
		v := c.askLocked()
		if saturated(v.Load) {
			break
		}
		b := c.topBandLocked()
		q := c.belowShareLocked(b, v.Shares)
		if q == nil {
			q = b.fairness.Next()
		}
		w := q.Head().Value.(*waiter)
		if !c.clock.Now().Before(w.item.Deadline) {
			// Its TTL ran out and its expiry has not taken the lock yet:
			// it waited its whole TTL, so it gets ErrTTL, not the slot.
			c.resolveLocked(w, EvictedTTL)
			continue
		}
		c.resolveLocked(w, Dispatched)
	}
	c.observer.DispatchCycle(time.Since(start))
}

func (c *Controller) topBandLocked() *band {
	for _, b := range c.bands {
		if b.queued > 0 {
			return b
		}
	}
	panic("flow: requests counted as queued but no band holds any")
}

// bandLocked returns priority p's band, creating a default one for a
// priority the config does not list.
func (c *Controller) bandLocked(p int) *band {
	if b := c.byPrio[p]; b != nil {
		return b
	}
	return c.addBandLocked(c.cfg.band(p))
}

func (c *Controller) addBandLocked(cfg BandConfig) *band {
	ord, err := policies.NewOrdering(cfg.Ordering)
	if err != nil {
		panic("flow: " + err.Error()) // Validate accepted it
	}
	fair, err := policies.NewFairness(cfg.Fairness, ord)
	if err != nil {
		panic("flow: " + err.Error())
	}
	b := &band{cfg: cfg, ordering: ord, fairness: fair, flows: map[string]*policies.Queue{}}
	c.byPrio[cfg.Priority] = b
	// Highest first. cmp.Compare, not p - x: priorities are any int the
	// config names, and the difference of two far apart overflows.
	i, _ := slices.BinarySearchFunc(c.bands, cfg.Priority, func(x *band, p int) int { return cmp.Compare(p, x.cfg.Priority) })
	c.bands = slices.Insert(c.bands, i, b)
	return b
}

// Kick asks the detector again and dispatches what it allows. The poller
// calls it; the adapter calls it when the pool's replicas change.
func (c *Controller) Kick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	queued := c.queued
	c.askLocked()
	c.dispatchLocked()
	if c.queued != queued {
		c.publishLocked()
	}
}

// poll asks the detector again every poll interval, and whenever its last
// answer's Recheck is ready. It re-reads both after each round and after
// a reload (retune), so a reload can change either.
func (c *Controller) poll() {
	defer close(c.polled)
	every, recheck := c.pollInputs()
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-c.retune:
			every, recheck = c.pollInputs()
			t.Reset(every)
			continue
		case <-recheck:
			c.Kick()
		case <-t.C:
			c.Kick()
			t.Reset(every)
		}
		every, recheck = c.pollInputs()
	}
}

func (c *Controller) pollInputs() (every time.Duration, recheck <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfg.PollInterval, c.verdict.Recheck
}

// Reconfigure applies a reloaded config and detector (nil keeps the
// current one), keeping every waiting request: bands are rebuilt with the
// new limits and policies and the waiters re-queued in arrival order, with
// their original deadlines. Limits apply to new arrivals only; nobody
// already queued is dropped. In-flight tickets stay valid.
func (c *Controller) Reconfigure(cfg Config, det SaturationDetector) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var waiting []*waiter
	for _, b := range c.bands {
		for _, q := range b.flows {
			for q.Len() > 0 {
				waiting = append(waiting, q.Pop().Value.(*waiter))
			}
		}
	}
	slices.SortFunc(waiting, func(a, b *waiter) int { return cmp.Compare(a.item.Seq, b.item.Seq) })
	c.cfg = cfg.WithDefaults()
	if det != nil {
		c.det = det
	}
	c.askLocked()
	c.bands, c.byPrio = nil, map[int]*band{}
	c.queued, c.bytes, c.tokens = 0, 0, 0
	for _, b := range c.cfg.Bands {
		c.addBandLocked(b)
	}
	for _, w := range waiting {
		c.insertLocked(c.bandLocked(w.req.Priority), w)
	}
	c.dispatchLocked()
	c.publishLocked()
	select {
	case c.retune <- struct{}{}:
	default: // already due
	}
	return nil
}

// Close resolves every waiting request with ErrShutdown (none is dropped
// silently) and refuses new ones. In-flight tickets can still be released.
// It is idempotent.
func (c *Controller) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for _, b := range c.bands {
		for _, q := range b.flows {
			for q.Len() > 0 {
				c.resolveLocked(q.Head().Value.(*waiter), EvictedOther)
			}
		}
	}
	c.publishLocked() // nothing is queued any more
	close(c.stop)
	c.mu.Unlock()
	<-c.polled
}
