package qll

import (
	"container/list"
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// State is one pool's queue and replica statistics. It outlives config
// reloads (the Caddy adapter keeps it in a usage pool keyed by pool name),
// so the EWMA and the waiting requests survive a reload.
//
// One mutex guards everything. Every transition of a waiter (dispatched,
// evicted, timed out, cancelled) and of an in-flight count happens under
// it, which is what makes "exactly once" visible in the code.
type State struct {
	mu       sync.Mutex
	cfg      Config
	replicas map[string]*replica // by dial address; includes removed ones still draining
	order    []*replica          // present replicas, in set order
	cursor   int                 // rotates tie-breaks so equal replicas share load
	picks    uint64              // requests dispatched, numbering each replica's last pick
	queue    list.List           // of *waiter, oldest first
	recovery *time.Timer         // re-runs dispatch when a down replica comes back
	// view, when set, is the proxy's current health view (see view.go);
	// viewPoll re-reads it while requests wait on flagged replicas.
	view          func() (unavailable, full []string)
	viewPoll      *time.Timer
	viewPollArmed bool
	closed        bool
	// anyUnavailable: some replica is marked unavailable (skips the
	// refresh in the common case where none ever is).
	anyUnavailable bool

	now func() time.Time
	// engine scrapes the replicas' own metrics (see engine.go); its
	// samples come in through engineSample. Never nil; with the engine
	// signals off it has no targets.
	engine *modelmetrics.Scraper
	ask    []string // askEngineLocked's buffer

	counters Counters
	// observeWait, when set, receives every dispatched request's queue wait.
	observeWait func(time.Duration)
}

type replica struct {
	addr        string
	url         string // base URL (scheme://host:port): where its engine metrics are read
	present     bool
	inFlight    int
	tried       [kinds]bool
	ewma        [kinds]float64 // seconds, per latency kind (see limit.go)
	spread      [kinds]float64 // exponentially weighted variance of the samples around ewma
	lim         concurrencyLimit
	eng         engineView // the replica's own metrics (see engine.go)
	consecFails int
	lastFail    time.Time // when the last of consecFails happened
	downUntil   time.Time
	lastPick    uint64 // s.picks when it last got a request (0: never)
	answering   int    // in flight with their response begun (FirstByte)
	unavailable bool   // the proxy's own health view excludes it (see Pick)
	// full: unavailable only because it is at the proxy's request limit
	// (busy, not down), with fullCap of our requests in flight when the
	// proxy said so: each of them that ends frees one slot under the limit.
	full    bool
	fullCap int

	dispatched uint64
	successes  uint64
	failures   uint64
}

type waiter struct {
	elem     *list.Element
	enqueued time.Time
	ready    chan struct{} // closed once the waiter is resolved
	avoid    []string      // replicas this request already failed on
	done     bool          // resolved (under State.mu)
	lease    *Lease
	err      error
	// timeout ends the wait after QueueTimeout; it runs under State.mu,
	// and a reload re-arms it (gen tells a re-armed timer's stale run).
	timeout *time.Timer
	gen     uint64
	// leave ends the context its lb.Waiter was given, once it is resolved
	// without a lease; nil without a Waiter.
	leave context.CancelFunc
}

// Counters are the pool-wide totals since the state was created.
type Counters struct {
	Dispatched uint64 // requests handed to a replica
	Released   uint64 // leases released; Dispatched-Released is in flight
	Evicted    uint64 // dropped from a full queue
	TimedOut   uint64 // dropped after QueueTimeout
	Cancelled  uint64 // clients that left while queued
	Refused    uint64 // refused without queueing (no backends, no queue)
	Failures   uint64 // attempts that ended in a transport error or 5xx
}

// Lease is one dispatched attempt. Release must be called exactly once;
// later calls are no-ops and return false.
type Lease struct {
	state    *State
	rep      *replica
	released atomic.Bool
	rounds   int  // service rounds the request was predicted to wait, >= 1
	answered bool // its response began (counted in replica.answering); under State.mu
	conc     int  // requests in flight on the replica when sent, itself included
	// grewFrom: the limit before this lease's first byte grew it in slow
	// start (0: it grew nothing); under State.mu. A 4xx takes it back.
	grewFrom float64
	// Addr is the dial address of the chosen replica.
	Addr string
	// Waited is how long the request waited in the queue.
	Waited time.Duration
}

// New returns an empty state. cfg must be valid (see Config.Validate).
func New(cfg Config) *State {
	cfg = cfg.WithDefaults()
	s := &State{cfg: cfg, replicas: map[string]*replica{}, now: time.Now, engine: modelmetrics.New(cfg.EngineMetrics)}
	s.engine.OnSample(s.engineSample)
	return s
}

// Run reads the replicas' own metrics until ctx ends (see engine.go);
// without it the learned limit alone decides.
func (s *State) Run(ctx context.Context) { s.engine.Run(ctx) }

// Engine is the scraper of the replicas' own metrics, for health and
// metrics output.
func (s *State) Engine() *modelmetrics.Scraper { return s.engine }

// engineSample takes a replica's new sample and dispatches waiters if
// it gave the replica more slots.
func (s *State) engineSample(addr string, smp modelmetrics.Sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.replicas[addr]
	if r == nil || s.cfg.NoEngineMetrics || s.cfg.Parallelism > 0 || s.cfg.LatencyThreshold > 0 {
		return
	}
	now := s.now()
	before := s.slotsLocked(r, now)
	r.eng.observe(smp, r.inFlight, s.engine.Config().Staleness)
	after := s.slotsLocked(r, now)
	if r.eng.wantsSample() && (r.eng.waiting > 0 || r.inFlight >= after) {
		// Only samples close together tell requests waiting for a step
		// from a full engine (see fullGap), a full one is let go as soon
		// as its queue is back within what it may hold (waitingAllowed),
		// and an engine at its slots (batching, or at its probe) gets
		// more only from a sample: ask again.
		s.engine.RefreshTargets(addr)
	}
	if after > before {
		s.dispatchLocked()
	}
}

// engineTargetsLocked points the scraper at the present replicas, or at
// none when the engine signals are off or would not be read.
func (s *State) engineTargetsLocked() {
	targets := map[string]string{}
	if !s.cfg.NoEngineMetrics && s.cfg.Parallelism == 0 && s.cfg.LatencyThreshold == 0 {
		for _, r := range s.order {
			targets[r.addr] = r.url
		}
	}
	s.engine.SetTargets(targets)
}

// askEngineLocked asks, while requests wait at the edge, for fresh
// samples of the replicas that a sample could let take one: usable (no
// sample lets a down, excluded or capped replica take one), at their
// slots, and exporting their queue (wantsSample). Asking for every
// replica scraped the rest every MinRefresh for nothing.
func (s *State) askEngineLocked() {
	if s.queue.Len() == 0 {
		return
	}
	now := s.now()
	s.ask = s.ask[:0]
	for _, r := range s.order {
		if r.eng.wantsSample() && s.usableLocked(r, now) && r.inFlight >= s.slotsLocked(r, now) {
			s.ask = append(s.ask, r.addr)
		}
	}
	s.engine.RefreshTargets(s.ask...)
}

// Configure swaps the config in place (on reload), keeping statistics and
// waiters, and dispatches in case the new limits allow more.
func (s *State) Configure(cfg Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cfg
	s.cfg = cfg.WithDefaults()
	s.engine.Configure(s.cfg.EngineMetrics)
	if s.cfg.NoEngineMetrics {
		for _, r := range s.replicas {
			r.eng = engineView{}
		}
	}
	s.engineTargetsLocked()
	if s.cfg.MaxFails != old.MaxFails || s.cfg.FailDuration != old.FailDuration {
		for _, r := range s.replicas {
			if r.consecFails > 0 {
				s.markDownLocked(r)
			}
		}
	}
	s.dispatchLocked()
	// The requests still waiting get the new queue settings too: a reload
	// that lowers queue_timeout or queue_max_size (an operator's answer
	// to requests waiting too long) must not leave them to the old ones.
	if s.cfg.QueueMaxSize < 0 {
		s.failAllLocked(lb.ErrQueueFull)
	}
	for s.queue.Len() > max(s.cfg.QueueMaxSize, 0) {
		s.resolveLocked(s.queue.Front().Value.(*waiter), nil, lb.ErrEvicted)
		s.counters.Evicted++
	}
	if s.cfg.QueueTimeout != old.QueueTimeout {
		now := s.now()
		for e := s.queue.Front(); e != nil; e = e.Next() {
			w := e.Value.(*waiter)
			s.armTimeoutLocked(w, w.enqueued.Add(s.cfg.QueueTimeout).Sub(now))
		}
	}
}

// SetWaitObserver installs a callback for queue waits (metrics).
func (s *State) SetWaitObserver(fn func(time.Duration)) {
	s.mu.Lock()
	s.observeWait = fn
	s.mu.Unlock()
}

// SetBackends makes set the present replicas, by dial address; each
// one's engine metrics are read at its URL (https://host:port for a TLS
// replica). Replicas that stay keep their statistics; new ones start
// untried (so they get work at once); removed ones finish their in-flight
// requests and are then forgotten. With no replica left, every waiter
// fails fast with ErrNoBackends; with only replicas the proxy last
// reported unavailable (see Pick), with lb.ErrAllDown.
func (s *State) SetBackends(set []lb.Backend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.replicas {
		r.present = false
	}
	s.order = s.order[:0]
	for _, b := range set {
		r, ok := s.replicas[b.Dial]
		if !ok {
			r = &replica{addr: b.Dial, lim: newConcurrencyLimit()}
			s.replicas[b.Dial] = r
		}
		if r.present {
			continue // duplicate in set
		}
		r.present = true
		r.url = b.URL
		s.order = append(s.order, r)
	}
	for a, r := range s.replicas {
		if !r.present {
			// A replica that comes back later starts with no stale
			// unavailable flag (the refresh only visits present ones).
			r.unavailable, r.full, r.fullCap = false, false, 0
			if r.inFlight == 0 {
				delete(s.replicas, a)
			}
		}
	}
	s.engineTargetsLocked()
	if len(s.order) == 0 {
		s.failAllLocked(lb.ErrNoBackends)
		return
	}
	if s.anyUnavailable && s.allUnavailableLocked() {
		s.failAllLocked(lb.ErrAllDown)
		return
	}
	s.dispatchLocked()
}

// SameBackends reports whether the n addresses given by addr are exactly
// the present set, in order: a cheap, allocation-free check that lets
// callers skip SetBackends on every request.
func (s *State) SameBackends(n int, addr func(i int) string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n != len(s.order) {
		return false
	}
	for i, r := range s.order {
		if r.addr != addr(i) {
			return false
		}
	}
	return true
}

// RetryAfter suggests how long a refused client should wait: the mean
// EWMA latency of the replicas (one request's worth of service), at least
// one second.
func (s *State) RetryAfter() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum, n := 0.0, 0
	kind := s.costKindLocked()
	for _, r := range s.order {
		if r.tried[kind] {
			sum += r.ewma[kind]
			n++
		}
	}
	d := time.Second
	if n > 0 {
		if m := time.Duration(sum / float64(n) * float64(time.Second)); m > d {
			d = m
		}
	}
	return d
}

// Acquire returns a lease on the best eligible replica, waiting in the FIFO
// queue when none is eligible. It returns ctx.Err() if the client leaves,
// or one of lb.ErrNoBackends, ErrQueueFull, ErrEvicted, ErrQueueTimeout,
// ErrShutdown. It is Pick for a request that reports no replica
// unavailable (so it clears the proxy's last view).
func (s *State) Acquire(ctx context.Context) (*Lease, error) {
	return s.acquire(ctx, nil, nil, nil, nil)
}

// acquire is Acquire with the proxy's current view (the replicas it will
// not use now, and of those the ones merely full; see Pick) and the
// replicas this request already failed on (a retry's avoid list: never
// picked for it; lb.ErrAllDown when no other is left, and the adapter
// asks again without it). onWait (if not nil) is told when the request
// waits in the queue.
func (s *State) acquire(ctx context.Context, unavailable, full, avoid []string, onWait lb.Waiter) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, lb.ErrShutdown
	}
	if len(s.order) == 0 {
		s.counters.Refused++
		s.mu.Unlock()
		return nil, lb.ErrNoBackends
	}
	if s.markUnavailableLocked(unavailable, full) {
		s.counters.Refused++
		s.mu.Unlock()
		return nil, lb.ErrAllDown
	}
	if len(avoid) > 0 && s.noneLeftLocked(avoid) {
		s.mu.Unlock()
		return nil, lb.ErrAllDown // not a refusal: the adapter asks again
	}
	now := s.now()
	// Fast path: nobody is waiting ahead of us and a replica is eligible.
	if s.queue.Len() == 0 {
		if r := s.pickLocked(now, avoid); r != nil {
			l := s.assignLocked(r, now, 0)
			s.mu.Unlock()
			return l, nil
		}
	}
	if s.cfg.QueueMaxSize < 0 {
		s.counters.Refused++
		s.mu.Unlock()
		return nil, lb.ErrQueueFull
	}
	for s.queue.Len() >= s.cfg.QueueMaxSize {
		oldest := s.queue.Front().Value.(*waiter)
		s.resolveLocked(oldest, nil, lb.ErrEvicted)
		s.counters.Evicted++
	}
	w := &waiter{enqueued: now, ready: make(chan struct{}), avoid: avoid}
	w.elem = s.queue.PushBack(w)
	s.dispatchLocked()
	waits := !w.done
	var left context.Context
	if waits {
		s.armTimeoutLocked(w, s.cfg.QueueTimeout)
		if onWait != nil {
			left, w.leave = context.WithCancel(context.Background())
		}
	}
	s.armViewPollLocked()
	s.mu.Unlock()
	if waits && onWait != nil {
		onWait.Waiting(left)
	}

	select {
	case <-w.ready:
		return w.lease, w.err
	case <-ctx.Done():
		return s.abandon(w, ctx.Err())
	}
}

// armTimeoutLocked (re)starts w's queue timeout: it ends after d, or at
// once when d <= 0. The timeout resolves w under the lock, so a dispatch
// and a timeout never both count.
func (s *State) armTimeoutLocked(w *waiter, d time.Duration) {
	if w.timeout != nil {
		w.timeout.Stop()
	}
	w.gen++
	gen := w.gen
	w.timeout = time.AfterFunc(max(d, 0), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.done || w.gen != gen {
			return // dispatched, gone, or re-armed by a reload meanwhile
		}
		s.resolveLocked(w, nil, lb.ErrQueueTimeout)
		s.counters.TimedOut++
	})
}

// abandon takes w out of the queue because its client left. If w was
// resolved first, that result stands: a lease is handed back (cancelled)
// so the slot is not lost, and a refusal is returned as it was (a
// timed-out pick whose Waiting was cut short made net/http end the
// request's context too: the timeout, not the client, ended it).
func (s *State) abandon(w *waiter, err error) (*Lease, error) {
	s.mu.Lock()
	if !w.done {
		s.resolveLocked(w, nil, err)
		s.counters.Cancelled++
		s.mu.Unlock()
		return nil, err
	}
	s.mu.Unlock()
	if w.lease != nil {
		w.lease.Release(lb.Outcome{Kind: lb.Cancelled})
		return nil, err
	}
	return nil, w.err
}

// resolveLocked ends w's wait exactly once.
func (s *State) resolveLocked(w *waiter, l *Lease, err error) {
	if w.done {
		return
	}
	w.done = true
	w.lease, w.err = l, err
	if w.timeout != nil {
		w.timeout.Stop()
	}
	// Its Waiting may block on a client: a refusal must not wait for it.
	// Not a retry answered ErrAllDown: the adapter asks again without its
	// avoid list, and the request goes on with what Waiting read.
	if l == nil && w.leave != nil && !(errors.Is(err, lb.ErrAllDown) && len(w.avoid) > 0) {
		w.leave()
	}
	s.queue.Remove(w.elem)
	close(w.ready)
}

func (s *State) failAllLocked(err error) {
	for s.queue.Len() > 0 {
		s.resolveLocked(s.queue.Front().Value.(*waiter), nil, err)
		s.counters.Refused++
	}
}

// dispatchLocked hands queued requests, oldest first, to eligible replicas
// until one side runs out. A retry whose only eligible replicas are the
// ones it failed on lets the requests behind it pass; one left with no
// other replica at all is answered lb.ErrAllDown (the adapter asks again
// without its avoid list).
func (s *State) dispatchLocked() {
	if s.queue.Len() == 0 {
		return
	}
	now := s.now()
	for e := s.queue.Front(); e != nil; {
		next := e.Next()
		w := e.Value.(*waiter)
		r := s.pickLocked(now, w.avoid)
		switch {
		case r != nil:
			s.resolveLocked(w, s.assignLocked(r, now, now.Sub(w.enqueued)), nil)
		case len(w.avoid) == 0:
			next = nil // nothing is free for anyone
		case s.noneLeftLocked(w.avoid):
			s.resolveLocked(w, nil, lb.ErrAllDown)
		}
		e = next
	}
	s.armRecoveryLocked(now)
	s.askEngineLocked()
}

func (s *State) assignLocked(r *replica, now time.Time, waited time.Duration) *Lease {
	// The request joins k others: with Parallelism p it waits for about
	// ceil((k+1)/p) service rounds. Release divides the observed latency
	// by that, so the EWMA estimates one round's time and the prediction
	// in pickLocked does not count the replica's queue twice.
	par := s.slotsLocked(r, now)
	rounds := (r.inFlight + par) / par
	r.inFlight++
	if r.inFlight >= par && r.eng.wantsSample() {
		// Its slots are used up, and only a sample gives it more: until
		// then its peers take its share (cut to what it ran, a batching
		// engine waited a second for its next scrape, its slots growing a
		// quarter per scrape, while its peers filled up to their KV bound;
		// at its probe, an engine not yet known to batch waited a second
		// to show it does, while the one read first took every arrival).
		s.engine.RefreshTargets(r.addr)
	}
	r.dispatched++
	s.picks++
	r.lastPick = s.picks
	s.counters.Dispatched++
	if s.observeWait != nil {
		s.observeWait(waited)
	}
	return &Lease{state: s, rep: r, Addr: r.addr, Waited: waited, rounds: rounds, conc: r.inFlight}
}

// armRecoveryLocked schedules a dispatch for when the earliest down replica
// comes back, if requests are waiting; otherwise nothing would wake them.
func (s *State) armRecoveryLocked(now time.Time) {
	if s.queue.Len() == 0 || s.closed {
		return
	}
	var next time.Time
	for _, r := range s.order {
		if r.downUntil.After(now) && (next.IsZero() || r.downUntil.Before(next)) {
			next = r.downUntil
		}
	}
	if next.IsZero() {
		return
	}
	d := next.Sub(now) + time.Millisecond
	if s.recovery == nil {
		s.recovery = time.AfterFunc(d, s.redispatch)
	} else {
		s.recovery.Reset(d)
	}
}

func (s *State) redispatch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dispatchLocked()
}

// Release ends the attempt: frees the replica's slot, feeds a success's
// latency into the EWMA, counts a failure against the replica, and
// dispatches waiting requests. It returns false if already released.
func (l *Lease) Release(o lb.Outcome) bool {
	if !l.released.CompareAndSwap(false, true) {
		return false
	}
	s, r := l.state, l.rep
	s.mu.Lock()
	defer s.mu.Unlock()
	r.inFlight--
	if l.answered {
		r.answering--
	}
	s.counters.Released++
	switch {
	case o.Kind == lb.Success && o.Status >= 400:
		// Answered, so not down, but refused, not served (TGI's 429 "model
		// is overloaded", a 404 for a model it does not serve): its few
		// milliseconds are no service time. Fed to the EWMA and the limit,
		// the overloaded replica looked fastest and its limit doubled.
		// Its first byte, which came before its status, grew nothing
		// either. A 429 says the replica is full at the concurrency it
		// was sent at.
		if l.grewFrom > 0 {
			r.lim.ungrow(l.grewFrom)
		}
		if o.Status == http.StatusTooManyRequests && s.cfg.Parallelism == 0 && s.cfg.LatencyThreshold == 0 {
			r.lim.refused(l.conc)
		}
		r.successes++
		r.consecFails = 0
		r.downUntil = time.Time{}
	case o.Kind == lb.Success:
		kind := plainKind
		if o.Streamed {
			kind = streamKind
		}
		x := o.Latency.Seconds() / float64(l.rounds)
		if !r.tried[kind] {
			r.ewma[kind], r.spread[kind], r.tried[kind] = x, 0, true
		} else {
			a, d := s.cfg.EWMAAlpha, x-r.ewma[kind]
			r.ewma[kind] += a * d
			r.spread[kind] = (1 - a) * (r.spread[kind] + a*d*d)
		}
		if s.cfg.Parallelism == 0 && s.cfg.LatencyThreshold == 0 {
			r.lim.observe(kind, l.conc, o.Latency.Seconds(), o.Total.Seconds(), s.cfg.MaxConcurrency, r.eng.saysRoom(s.now()))
		}
		r.successes++
		r.consecFails = 0
		r.downUntil = time.Time{}
	case o.Kind == lb.Failure:
		r.failures++
		s.counters.Failures++
		r.consecFails++
		r.lastFail = s.now()
		s.markDownLocked(r)
	}
	if !r.present && r.inFlight == 0 && s.replicas[r.addr] == r {
		delete(s.replicas, r.addr)
	}
	s.refreshViewLocked()
	s.dispatchLocked()
	return true
}

// markDownLocked sets r's down time from its failures in a row and the
// settings now (again on reload: a shortened fail_duration applies to a
// replica already down).
func (s *State) markDownLocked(r *replica) {
	r.downUntil = time.Time{}
	if r.consecFails >= s.cfg.MaxFails {
		factor := 1 << min(r.consecFails-s.cfg.MaxFails, 4)
		r.downUntil = r.lastFail.Add(time.Duration(min(factor, maxBackoffFactor)) * s.cfg.FailDuration)
	}
}

// FirstByte implements lb.FirstByter: the response counts as answering
// until released, and in slow start a first byte while more than half the
// limit's requests answer at once doubles the limit; the waiting requests
// get the new slots at once.
func (l *Lease) FirstByte(time.Duration) {
	if l.released.Load() {
		return
	}
	s, r := l.state, l.rep
	s.mu.Lock()
	defer s.mu.Unlock()
	// Release sets released before it takes the lock: checked again here,
	// a lease released meanwhile is never counted as answering.
	if l.released.Load() || l.answered {
		return
	}
	l.answered = true
	r.answering++
	if s.cfg.Parallelism != 0 || s.cfg.LatencyThreshold != 0 {
		return
	}
	now := s.now()
	before := s.slotsLocked(r, now)
	if from := r.lim.limit; r.lim.firstByte(r.answering, s.cfg.MaxConcurrency) {
		l.grewFrom = from
	}
	if s.slotsLocked(r, now) > before {
		s.dispatchLocked()
	}
}

// Close fails every waiter with ErrShutdown and refuses new requests.
// In-flight leases can still be released.
func (s *State) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.failAllLocked(lb.ErrShutdown)
	if s.recovery != nil {
		s.recovery.Stop()
	}
	if s.viewPoll != nil {
		s.viewPoll.Stop()
	}
}
