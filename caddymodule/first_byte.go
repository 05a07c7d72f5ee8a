package caddymodule

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
)

// A replica that accepts connections and never answers would hold every
// request sent to it until the client gives up, and the client's leaving
// says nothing against the replica. So each attempt has a limit on its
// time to first byte: past it the attempt is abandoned (the client gets
// 504 and may retry) and counted as the replica's failure.
//
// The automatic limit must never cut a healthy replica's slow answer (the
// engine did the work, the client gets 504, the replica is counted as
// failed). Two things make a healthy answer slow: its kind (an answer sent
// whole has its first byte when the whole generation is done, a streamed
// one at its start), so each kind is held to its own usual time; and a
// queue in the engine (a burst waits there in turn), so an attempt is
// abandoned only once its replica has sent no first byte, to any request,
// for a whole limit: a replica that answers others is alive.

// attemptOptions are the per-attempt settings every policy has.
type attemptOptions struct {
	// FirstByteTimeout bounds an attempt's time to first byte. 0 (the
	// default): derived from the replica's own history — 20× its usual
	// time to first byte for the same kind of answer (streamed or whole),
	// between 10 s and 10 min, 2 min before it has answered one; and only
	// once the replica has sent no first byte to any request for that
	// long. Positive: a hard limit on every attempt. Negative: no limit.
	FirstByteTimeout caddy.Duration `json:"first_byte_timeout,omitempty"`
}

const (
	firstByteFactor   = 20
	firstByteMin      = 10 * time.Second
	firstByteMax      = 10 * time.Minute
	firstByteUnknown  = 2 * time.Minute
	firstByteEWMAKeep = 0.8 // weight of the history in each new sample
)

// firstByteStats keeps each replica's usual time to first byte (an EWMA),
// learned from the attempts' traces; it lives in the pool's shared state.
type firstByteStats struct {
	m sync.Map // dial -> *firstByteUsual
}

// firstByteUsual is one replica's usual time to first byte, for each kind
// of answer, and when it last sent one. An attempt looks it up once, in
// Select, for both its limit and its sample.
type firstByteUsual struct {
	streamed, whole atomic.Int64 // ns; 0: no sample yet
	// lastAnswer is when the replica last sent a first byte, in ns since
	// firstByteEpoch (0: never).
	lastAnswer atomic.Int64
	// erring: the last answer released was an error (5xx, or the
	// attempt failed). Its first bytes are then no sign of life (a dead
	// engine behind a live HTTP server answers 503 at once, and passive
	// health keeps probing it) until an answer that is not one.
	erring atomic.Bool
}

// firstByteEpoch is the origin of lastAnswer: a monotonic reading, so a
// wall-clock step neither revives nor abandons an attempt.
var firstByteEpoch = time.Now()

// of is dial's record, made on first use.
func (s *firstByteStats) of(dial string) *firstByteUsual {
	v, ok := s.m.Load(dial)
	if !ok { // LoadOrStore alone would allocate a record on every call
		v, _ = s.m.LoadOrStore(dial, new(firstByteUsual))
	}
	return v.(*firstByteUsual)
}

// keepOnly drops the records of replicas not in set: a pool whose
// replicas keep changing would otherwise keep one for every address it
// ever picked. A replica that comes back starts again from no sample; an
// attempt still out to a dropped one updates a record nobody reads.
func (s *firstByteStats) keepOnly(set []lb.Backend) {
	keep := make(map[string]struct{}, len(set))
	for _, b := range set {
		keep[b.Dial] = struct{}{}
	}
	s.m.Range(func(k, _ any) bool {
		if _, ok := keep[k.(string)]; !ok {
			s.m.Delete(k)
		}
		return true
	})
}

func (u *firstByteUsual) kind(streamed bool) *atomic.Int64 {
	if streamed {
		return &u.streamed
	}
	return &u.whole
}

// answered notes that the replica sent a first byte at at. lastAnswer
// only moves forward: two attempts' hooks may store their readings of
// the clock out of order, and the earlier one must not shorten the
// replica's silence.
func (u *firstByteUsual) answered(at time.Time) {
	ns := max(int64(at.Sub(firstByteEpoch)), 1)
	for {
		old := u.lastAnswer.Load()
		if old >= ns || u.lastAnswer.CompareAndSwap(old, ns) {
			return
		}
	}
}

// released notes how an answer whose first byte came first after start
// ended: an error makes the replica erring; the first other answer after
// errors ends that, and counts as the sign of life its first byte was not
// taken for.
func (u *firstByteUsual) released(start time.Time, first time.Duration, o lb.Outcome) {
	if o.Kind == lb.Failure || o.Status >= 500 {
		u.erring.Store(true)
		return
	}
	if first > 0 && u.erring.Load() && u.erring.CompareAndSwap(true, false) {
		u.answered(start.Add(first))
	}
}

// learn adds a first byte d of an answer of the given kind to the
// replica's usual time for that kind.
func (u *firstByteUsual) learn(d time.Duration, streamed bool) {
	usual := u.kind(streamed)
	for {
		old := usual.Load()
		next := int64(d)
		if old > 0 {
			next = int64(firstByteEWMAKeep*float64(old) + (1-firstByteEWMAKeep)*float64(d))
		}
		if usual.CompareAndSwap(old, next) {
			return
		}
	}
}

// limit is an attempt's first-byte limit on this replica (0: none) for an
// answer of the given kind, and whether it is the automatic one.
func (u *firstByteUsual) limit(configured time.Duration, streamed bool) (time.Duration, bool) {
	switch {
	case configured < 0:
		return 0, false
	case configured > 0:
		return configured, false
	}
	usual := time.Duration(u.kind(streamed).Load())
	if usual == 0 {
		return firstByteUnknown, true
	}
	return min(max(firstByteFactor*usual, firstByteMin), firstByteMax), true
}

// firstByteRule is how one attempt's first byte is watched and learned.
type firstByteRule struct {
	limit    time.Duration // 0: none
	auto     bool          // the automatic limit: it waits for the replica's silence
	streamed bool          // the answer's kind the request asked for
	// kindUnknown: the request did not say its kind (a body not parsed:
	// queued_least_latency and global_redis_least never parse it, a
	// body over max_body_bytes, a path that is not an inference call's);
	// only the response's Content-Type tells what it teaches.
	kindUnknown bool
	usual       *firstByteUsual // the replica's record; nil: nothing learned
}

// firstByteRuleFor is the rule of an attempt on usual's replica; known:
// the request says the kind of its answer (streamed).
func firstByteRuleFor(usual *firstByteUsual, configured time.Duration, streamed, known bool) firstByteRule {
	limit, auto := usual.limit(configured, streamed)
	if auto && !known {
		// Either kind: the longer limit (a kind never seen has the
		// limit of a replica never heard), so a long answer sent whole
		// is not held to the streams' usual time.
		other, _ := usual.limit(configured, !streamed)
		limit = max(limit, other)
	}
	return firstByteRule{limit: limit, auto: auto, streamed: streamed, kindUnknown: !known, usual: usual}
}

// silentUntil is when the replica will have sent no first byte for d:
// the earliest an automatic limit of d may abandon an attempt on it.
func (u *firstByteUsual) silentUntil(d time.Duration) time.Time {
	return firstByteEpoch.Add(time.Duration(u.lastAnswer.Load()) + d)
}

// errFirstByteTimeout is why an attempt was abandoned. It is a timeout
// (reverse_proxy answers 504), not a cancellation (which it would take
// for the client leaving).
var errFirstByteTimeout = firstByteTimeoutError{}

type firstByteTimeoutError struct{}

func (firstByteTimeoutError) Error() string {
	return "no first byte from the replica within its first_byte_timeout"
}
func (firstByteTimeoutError) Timeout() bool   { return true }
func (firstByteTimeoutError) Temporary() bool { return true }

// attemptContext is the context of one attempt: the request's, plus an
// end of its own that the first-byte limit can call. (A deadline would
// also cut a response that is already streaming.) Its Err is a timeout
// after the limit (reverse_proxy answers 504 for it, where
// context.Canceled would read as the client leaving); the transport
// returns the cause it was ended with, the same timeout.
//
// It is a context.WithCancelCause, so that the transport's own
// per-round-trip child finds it as its parent and joins its children:
// reverse_proxy wraps the request's context in values before the round
// trip, so a context type of Sluice's own (tried: one with the AfterFunc
// method the context package looks for) is hidden behind them, and the
// context package then started a goroutine per attempt to watch it, which
// cost more than the child it saved.
//
// It is not the request context's child: it sits on the request's values
// alone (requestValues), and the request's end reaches it through the
// end hook the attempt arms anyway (requestEnded). Joined to the
// request's context as well, it cost every request an entry in that
// context's children and the walk up Caddy's value chain to put it there
// and take it out: 0.5% of the proxy's CPU on tiny requests.
type attemptContext struct {
	context.Context
	cancel context.CancelCauseFunc
	values requestValues // the parent of Context

	mu         sync.Mutex
	stopParent func() bool // disarms the request's end hook; nil once run or disarmed
}

// requestValues is a request's context without its end: its values and
// deadline, no Done (so a context made on it is nobody's child). Not
// context.WithoutCancel: that one is an allocation more per attempt, and
// drops the deadline the transport's dial would still honour.
type requestValues struct{ context.Context }

func (requestValues) Done() <-chan struct{} { return nil }
func (requestValues) Err() error            { return nil }

// init makes c the context of an attempt on parent; onParentEnd runs (in
// its own goroutine) when parent ends, unless detach or end came first.
func (c *attemptContext) init(parent context.Context, onParentEnd func()) {
	c.values.Context = parent
	c.Context, c.cancel = context.WithCancelCause(&c.values)
	c.mu.Lock()
	c.stopParent = context.AfterFunc(parent, onParentEnd)
	c.mu.Unlock()
}

// Err is the cause the attempt ended with: the first-byte timeout, or
// the request's own end.
func (c *attemptContext) Err() error {
	if c.Context.Err() == nil {
		return nil
	}
	return context.Cause(c.Context)
}

// end ends the attempt for err (the first end wins). The request's end
// hook stays armed: an attempt abandoned at its first-byte limit still
// holds its lease until the request ends.
func (c *attemptContext) end(err error) {
	if c.cancel != nil {
		c.cancel(err)
	}
}

// parentEnded ends c as the request's context ended: it is how the
// request's end reaches the attempt (and the transport's round trip).
func (c *attemptContext) parentEnded() {
	if p := c.values.Context; p != nil {
		c.end(context.Cause(p))
	}
}

// detach disarms the request's end hook without ending c; it reports
// whether the hook will not run.
func (c *attemptContext) detach() bool {
	c.mu.Lock()
	stop := c.stopParent
	c.stopParent = nil
	c.mu.Unlock()
	return stop == nil || stop()
}

// stop ends the attempt and disarms the request's end hook; called when
// the attempt is over.
func (c *attemptContext) stop() {
	c.detach()
	c.end(context.Canceled)
}

// The first-byte limits are watched by one timer for the whole process,
// not one per attempt: a timer per attempt cost two allocations and a
// timer-heap insertion and removal on every request, for a limit that
// almost never fires. The attempts waiting for their first byte are in a
// list (linked through the traces: no allocation), and the timer is armed
// for the earliest deadline of the list's attempts when it was last
// looked at. A new attempt re-arms it only when its deadline is earlier
// (a shorter limit); when it fires, the attempts past their deadline are
// abandoned and it is armed for the earliest left. An attempt leaves the
// list at its first byte or its end, so nothing of a finished request is
// kept, and a timer that finds the list empty stays unarmed.
type firstByteWatch struct {
	mu    sync.Mutex
	head  *attemptTrace
	n     int // attempts in the list
	timer *time.Timer
	next  time.Time // when the timer fires; zero: not armed
}

// firstByteWatched is the process's watch.
var firstByteWatched firstByteWatch

// watch adds t, which must expire at t.deadline unless it leaves first
// (or, with an automatic limit, its replica answers meanwhile).
func (w *firstByteWatch) watch(t *attemptTrace) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t.watchPrev, t.watchNext, t.watched = nil, w.head, true
	if w.head != nil {
		w.head.watchPrev = t
	}
	w.head = t
	w.n++
	if w.next.IsZero() || t.deadline.Before(w.next) {
		w.armLocked(t.deadline)
	}
}

// unwatch takes t out of the list, if it is in it.
func (w *firstByteWatch) unwatch(t *attemptTrace) {
	w.mu.Lock()
	w.unlinkLocked(t)
	w.mu.Unlock()
}

func (w *firstByteWatch) unlinkLocked(t *attemptTrace) {
	if !t.watched {
		return
	}
	if t.watchPrev != nil {
		t.watchPrev.watchNext = t.watchNext
	} else {
		w.head = t.watchNext
	}
	if t.watchNext != nil {
		t.watchNext.watchPrev = t.watchPrev
	}
	t.watchPrev, t.watchNext, t.watched = nil, nil, false
	w.n--
}

func (w *firstByteWatch) armLocked(at time.Time) {
	w.next = at
	d := time.Until(at)
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.fire)
		return
	}
	w.timer.Reset(d)
}

// fire abandons the attempts past their deadline (an automatic one moved
// on to its replica's silence) and re-arms the timer for the earliest
// left.
func (w *firstByteWatch) fire() {
	var expired []*attemptTrace
	w.mu.Lock()
	now := time.Now()
	var earliest time.Time
	for t := w.head; t != nil; {
		next := t.watchNext
		if !now.Before(t.deadline) {
			if t.auto && t.usual != nil {
				// An automatic limit waits for the replica's silence.
				t.deadline = t.usual.silentUntil(t.limit)
			}
			if until := t.clientUntil(now); until.After(t.deadline) {
				t.deadline = until
			}
		}
		if !now.Before(t.deadline) {
			w.unlinkLocked(t)
			expired = append(expired, t)
		} else if earliest.IsZero() || t.deadline.Before(earliest) {
			earliest = t.deadline
		}
		t = next
	}
	w.next = time.Time{}
	if !earliest.IsZero() {
		w.armLocked(earliest)
	}
	w.mu.Unlock()
	for _, t := range expired {
		t.expire()
	}
}

// clientUntil is the earliest the attempt traced by t may be abandoned
// for its client's upload: a limit after the transport last had the
// client's bytes, or after now while it still waits for them. The limit
// counts the replica's time (as net/http's ResponseHeaderTimeout counts
// from the request written): a client uploading slowly, or stalling on
// purpose, made its replica time out and count a failure. A replica that
// stops taking the body, or takes it and sends nothing, is abandoned a
// limit after the last bytes it was sent.
func (t *attemptTrace) clientUntil(now time.Time) time.Time {
	if t.uploading.Load() {
		return now.Add(t.limit)
	}
	if at := t.uploaded.Load(); at > 0 {
		return t.start.Add(time.Duration(at) + t.limit)
	}
	return time.Time{}
}

// len is how many attempts wait for their first byte (for tests).
func (w *firstByteWatch) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}
