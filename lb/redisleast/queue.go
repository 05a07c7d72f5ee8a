package redisleast

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
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
//     ({tag}:queue, {tag}:waiters). A new request never overtakes a
//     waiting one.
//   - Whatever frees a slot (a release, a reaped instance, a Sync adding
//     replicas, a lost-select cleanup, the background kick) runs dispatch in
//     the same script: the oldest live waiter anywhere gets the least-loaded
//     member, recorded under the WAITER's instance hash (so if that
//     instance dies the reaper reclaims the slot) and in {tag}:assigned,
//     and the waiter's instance is told by PUBLISH on its channel. Nobody
//     polls Redis.
//   - Each instance holds one subscription (a dedicated client) to its
//     channel and routes "<request id> <replica>" to the waiting Select.
//   - A waiter that gives up (client gone, QueueTimeout) runs the cancel
//     script: still queued → removed atomically (ctx.Err() or
//     ErrQueueTimeout); already handed a slot → on timeout it keeps the
//     slot (dispatched just in time), on cancellation it releases it at
//     once, which hands it to the next waiter.
//
// Lost notifications: pub/sub is at-most-once, but a message is only lost
// when the subscription's connection breaks. On every (re)subscription the
// instance looks up all its waiters in {tag}:assigned once, and a waiter
// whose deadline passes without a message finds its slot through the
// cancel script; so a lost message costs at most that waiter's remaining
// QueueTimeout, never a slot.
//
// A queued request may be given any member replica: the queue does not
// keep each waiter's candidate list, so in queueing mode the member set
// (Sync) is the authority, and candidates only steer immediate picks.
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

func (s *Store) queueing() bool { return s.conf().QueueTimeout > 0 }

// waiterSet routes hand-over notifications to the waiting Selects.
type waiterSet struct {
	mu sync.Mutex
	m  map[string]chan string // token → replica (buffered 1)
}

func (w *waiterSet) add(tok string) chan string {
	ch := make(chan string, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = map[string]chan string{}
	}
	w.m[tok] = ch
	w.mu.Unlock()
	return ch
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
	ch := w.m[tok]
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
)

// await waits for the queued request's slot: a notification, or, at
// ctx done / QueueTimeout / Close, the cancel script's verdict.
func (s *Store) await(ctx context.Context, ident *identity, req string, ch chan string) (*Lease, error) {
	start := time.Now()
	tok := token(ident, req)
	s.c.queuedTotal.Add(1)
	s.life.Lock()
	if s.closed.Load() {
		s.life.Unlock()
		return s.giveUp(ctx, ident, req, start, gaveUpClosed)
	}
	s.qwg.Add(1)
	s.life.Unlock()
	defer s.qwg.Done()
	t := time.NewTimer(s.conf().QueueTimeout)
	defer t.Stop()
	select {
	case rep := <-ch:
		s.waiters.drop(tok)
		return s.handed(ident, req, rep, start), nil
	case <-ctx.Done():
		return s.giveUp(ctx, ident, req, start, gaveUpCancelled)
	case <-t.C:
		return s.giveUp(ctx, ident, req, start, gaveUpTimeout)
	case <-s.done:
		return s.giveUp(ctx, ident, req, start, gaveUpClosed)
	}
}

// handed makes the lease of a slot the queue gave this request.
func (s *Store) handed(ident *identity, req, rep string, start time.Time) *Lease {
	s.c.wait.observe(time.Since(start))
	s.c.handovers.Add(1)
	s.local.get(rep).Add(1)
	s.c.selections.Add(1)
	return &Lease{Addr: rep, s: s, ident: ident, req: req, start: time.Now(), hl: s.health.Acquire(rep)}
}

// giveUp takes the waiter out of the queue, or claims the slot it was
// handed meanwhile.
func (s *Store) giveUp(ctx context.Context, ident *identity, req string, start time.Time, why giveUpReason) (*Lease, error) {
	tok := token(ident, req)
	res := s.call(context.Background(), func(ctx context.Context) rueidis.RedisResult {
		return cancelQueueScript.Exec(ctx, s.rc(), []string{s.k.queue, s.k.waiters, s.k.assigned, s.k.avoid}, []string{tok})
	})
	s.waiters.drop(tok)
	arr, err := res.ToArray()
	if err == nil && len(arr) != 2 {
		err = errBadReply
	}
	code := int64(-1)
	var rep string
	if err == nil {
		code, _ = arr[0].AsInt64()
		rep, _ = arr[1].ToString()
	} else {
		// Unknown whether it is still queued or was handed a slot: the
		// lost-select release takes it out of the queue, or releases the
		// slot, once Redis answers.
		s.queueRelease(ident, "?"+req)
	}
	if code == 1 {
		l := s.handed(ident, req, rep, start)
		if why != gaveUpCancelled {
			return l, nil // dispatched just in time
		}
		l.Release(lb.Outcome{Kind: lb.Cancelled}) // hands it to the next waiter
		s.c.queueCancels.Add(1)
		return nil, ctx.Err()
	}
	switch why {
	case gaveUpCancelled:
		s.c.queueCancels.Add(1)
		return nil, ctx.Err()
	case gaveUpClosed:
		return nil, lb.ErrShutdown
	}
	s.c.queueTimeouts.Add(1)
	return nil, ErrQueueTimeout
}

// subscribe keeps this instance's notification channel subscribed (one
// dedicated client, one long-lived SUBSCRIBE), resubscribing after a
// broken connection or an identity rotation, until Close.
func (s *Store) subscribe() {
	defer s.wg.Done()
	defer s.sub.Close()
	for {
		ident := s.ident.Load()
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
			errc <- s.sub.Receive(hctx, s.sub.B().Subscribe().Channel(s.k.notify(ident.id)).Build(),
				func(m rueidis.PubSubMessage) {
					if req, rep, ok := strings.Cut(m.Message, " "); ok {
						s.waiters.deliver(token(ident, req), rep)
					}
				})
		}()
		done, rotated := s.done, s.rotated
	wait:
		for {
			select {
			case <-confirmed:
				s.subOnce.Do(func() { close(s.subReady) })
				s.recheck()
			case <-rotated:
				rotated = nil
				cancel()
			case <-done:
				done = nil
				cancel()
			case err := <-errc:
				if _, isReply := rueidis.IsRedisErr(err); isReply {
					s.subErr.Store(&err) // NOPERM: New reports it
				}
				break wait
			}
		}
		failed := ctx.Err() == nil
		cancel()
		select {
		case <-s.done:
			return
		default:
		}
		if failed && !backoffSleep(s.done, min(s.conf().BreakerBackoff, 250*time.Millisecond)) {
			return
		}
	}
}

// recheck looks every waiter up in {tag}:assigned once: a hand-over
// published while the subscription was down is found here.
func (s *Store) recheck() {
	toks := s.waiters.tokens()
	if len(toks) == 0 {
		return
	}
	res := s.call(context.Background(), func(ctx context.Context) rueidis.RedisResult {
		return s.rc().Do(ctx, s.rc().B().Hmget().Key(s.k.assigned).Field(toks...).Build())
	})
	vals, err := res.ToArray()
	if err != nil {
		return
	}
	for i, v := range vals {
		if rep, err := v.ToString(); err == nil && i < len(toks) {
			s.waiters.deliver(toks[i], rep)
		}
	}
}

// kick dispatches whatever is free and refreshes the queue gauge.
func (s *Store) kick(ctx context.Context) {
	res := s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return kickQueueScript.Exec(ctx, s.rc(), []string{s.k.queue, s.k.waiters, s.k.load},
			[]string{strconv.Itoa(s.conf().MaxInflight), s.k.tag})
	})
	if arr, err := res.ToArray(); err == nil && len(arr) == 3 {
		n, _ := arr[2].AsInt64()
		s.c.queueLen.Store(n)
	}
}

// execRelease sends releases (request ids, "?id" for lost selects)
// recorded under ident, with the script of the mode.
func (s *Store) execRelease(ctx context.Context, ident *identity, ids []string) rueidis.RedisResult {
	return s.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		if !s.queueing() {
			return releaseScript.Exec(ctx, s.rc(), []string{s.k.load, s.k.gone, ident.inst}, ids)
		}
		args := make([]string, 0, 3+len(ids))
		args = append(args, strconv.Itoa(s.conf().MaxInflight), s.k.tag, ident.id)
		args = append(args, ids...)
		return releaseQueueScript.Exec(ctx, s.rc(),
			[]string{s.k.load, s.k.gone, ident.inst, s.k.queue, s.k.waiters, s.k.assigned, s.k.avoid}, args)
	})
}
