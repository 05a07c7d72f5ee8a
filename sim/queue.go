package sim

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// errClosed is returned by slotQueue.acquire when the replica is closed.
var errClosed = errors.New("sim: replica closed")

// slotQueue is a counting semaphore with a strict FIFO wait list. A slot is
// handed directly from a finishing request to the head waiter, so no later
// arrival can overtake a waiter. A waiter whose context ends is removed from
// the list at once.
//
// With a KV capacity (kvCap > 0) a slot also needs room for the request's
// prompt tokens: the head waiter is admitted only when a slot is free and
// its tokens fit next to the tokens held by the running requests (or when
// nothing is running, so that a prompt larger than the whole capacity is
// admitted alone). The wait list stays strictly FIFO: a head waiter that
// does not fit holds back the waiters behind it.
type slotQueue struct {
	mu         sync.Mutex
	limit      int
	running    int
	kvCap      int       // KV capacity in tokens; 0: slots only
	kvUsed     int       // tokens held by the running requests (prompt + generated)
	waiters    list.List // of *slotWaiter
	started    uint64    // slots granted so far; the last grant's sequence number
	maxRunning int
	maxWaiting int
	// maxInFlight is the largest running + waiting seen at once: every
	// request the replica held, served or queued.
	maxInFlight int
	// waited sums, over the requests granted a slot, the time they spent
	// in the wait list (0 for those admitted on arrival); queued counts
	// the requests granted a slot from the wait list, maxWait is the
	// longest such wait.
	waited, maxWait time.Duration
	queued          uint64
	closed          bool
}

type slotWaiter struct {
	ready  chan struct{} // closed when the slot is granted (or the queue closes)
	tokens int           // KV tokens to hold once admitted
	seq    uint64        // grant sequence number, set before ready is closed
	err    error         // errClosed if the queue closed instead of granting
	since  time.Time     // when it joined the wait list
}

func newSlotQueue(limit, kvCap int) *slotQueue {
	return &slotQueue{limit: limit, kvCap: kvCap}
}

// acquire waits for a serving slot in FIFO order, holding no KV tokens.
func (q *slotQueue) acquire(ctx context.Context, done <-chan struct{}) (uint64, error) {
	return q.acquireTokens(ctx, done, 0)
}

// fitsLocked reports whether a request holding tokens KV tokens can start now.
func (q *slotQueue) fitsLocked(tokens int) bool {
	if q.running >= q.limit {
		return false
	}
	return q.kvCap == 0 || q.running == 0 || q.kvUsed+tokens <= q.kvCap
}

// acquireTokens waits for a serving slot in FIFO order, and, with a KV
// capacity, for room for tokens KV tokens (the prompt), which the request
// then holds until releaseTokens. It returns the slot's sequence number
// (1-based order in which slots were granted). On error the caller holds no
// slot and no tokens.
func (q *slotQueue) acquireTokens(ctx context.Context, done <-chan struct{}, tokens int) (uint64, error) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, errClosed
	}
	if q.waiters.Len() == 0 && q.fitsLocked(tokens) {
		q.running++
		q.kvUsed += tokens
		q.started++
		seq := q.started
		q.maxRunning = max(q.maxRunning, q.running)
		q.maxInFlight = max(q.maxInFlight, q.running+q.waiters.Len())
		q.mu.Unlock()
		return seq, nil
	}
	w := &slotWaiter{ready: make(chan struct{}), tokens: tokens, since: time.Now()}
	elem := q.waiters.PushBack(w)
	q.maxWaiting = max(q.maxWaiting, q.waiters.Len())
	q.maxInFlight = max(q.maxInFlight, q.running+q.waiters.Len())
	q.mu.Unlock()

	var cause error
	select {
	case <-w.ready:
		return w.seq, w.err
	case <-ctx.Done():
		cause = ctx.Err()
	case <-done:
		cause = errClosed
	}

	q.mu.Lock()
	select {
	case <-w.ready:
		// Granted concurrently with the cancellation: give the slot back
		// (to the next waiter) without serving.
		q.mu.Unlock()
		if w.err == nil {
			q.releaseTokens(w.tokens)
		}
		return 0, cause
	default:
		q.waiters.Remove(elem)
		// With a KV capacity the waiter behind may fit where this one did
		// not; without one this grants nothing (a waiter exists only while
		// every slot is taken).
		q.grantLocked()
		q.mu.Unlock()
		return 0, cause
	}
}

// release frees a slot holding no KV tokens.
func (q *slotQueue) release() { q.releaseTokens(0) }

// releaseTokens frees a slot and the tokens KV tokens it held, admitting
// the head waiters that now fit.
func (q *slotQueue) releaseTokens(tokens int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.running--
	q.kvUsed -= tokens
	q.grantLocked()
}

// grantLocked admits head waiters, in order, while they fit.
func (q *slotQueue) grantLocked() {
	if q.closed {
		return
	}
	for front := q.waiters.Front(); front != nil; front = q.waiters.Front() {
		w := front.Value.(*slotWaiter)
		if !q.fitsLocked(w.tokens) {
			return
		}
		q.waiters.Remove(front)
		q.running++
		q.kvUsed += w.tokens
		q.started++
		q.maxRunning = max(q.maxRunning, q.running)
		wait := time.Since(w.since)
		q.waited += wait
		q.maxWait = max(q.maxWait, wait)
		q.queued++
		w.seq = q.started
		close(w.ready)
	}
}

// grow adds n KV tokens (generated output) to those held by a running
// request. It never admits anyone: held tokens only shrink on release.
func (q *slotQueue) grow(n int) {
	q.mu.Lock()
	q.kvUsed += n
	q.mu.Unlock()
}

// close makes all current and future waiters fail with errClosed.
func (q *slotQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for e := q.waiters.Front(); e != nil; e = q.waiters.Front() {
		w := q.waiters.Remove(e).(*slotWaiter)
		w.err = errClosed
		close(w.ready)
	}
}

// counts returns the current number of running and waiting requests.
func (q *slotQueue) counts() (running, waiting int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running, q.waiters.Len()
}

type queueSnapshot struct {
	running, waiting, maxRunning, maxWaiting int
	maxInFlight                              int
	kvUsed                                   int
	started, queued                          uint64
	waited, maxWait                          time.Duration
}

func (q *slotQueue) snapshot() queueSnapshot {
	q.mu.Lock()
	defer q.mu.Unlock()
	return queueSnapshot{
		running:     q.running,
		waiting:     q.waiters.Len(),
		maxRunning:  q.maxRunning,
		maxWaiting:  q.maxWaiting,
		maxInFlight: q.maxInFlight,
		kvUsed:      q.kvUsed,
		started:     q.started,
		waited:      q.waited,
		maxWait:     q.maxWait,
		queued:      q.queued,
	}
}
