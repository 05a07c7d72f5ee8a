package sim

import (
	"container/list"
	"context"
	"errors"
	"sync"
)

// errClosed is returned by slotQueue.acquire when the replica is closed.
var errClosed = errors.New("sim: replica closed")

// slotQueue is a counting semaphore with a strict FIFO wait list. A slot is
// handed directly from a finishing request to the head waiter, so no later
// arrival can overtake a waiter. A waiter whose context ends is removed from
// the list at once.
type slotQueue struct {
	mu         sync.Mutex
	limit      int
	running    int
	waiters    list.List // of *slotWaiter
	started    uint64    // slots granted so far; the last grant's sequence number
	maxRunning int
	maxWaiting int
	closed     bool
}

type slotWaiter struct {
	ready chan struct{} // closed when the slot is granted (or the queue closes)
	seq   uint64        // grant sequence number, set before ready is closed
	err   error         // errClosed if the queue closed instead of granting
}

func newSlotQueue(limit int) *slotQueue {
	return &slotQueue{limit: limit}
}

// acquire waits for a serving slot in FIFO order. It returns the slot's
// sequence number (1-based order in which slots were granted). On error the
// caller holds no slot.
func (q *slotQueue) acquire(ctx context.Context, done <-chan struct{}) (uint64, error) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, errClosed
	}
	if q.running < q.limit && q.waiters.Len() == 0 {
		q.running++
		q.started++
		seq := q.started
		q.maxRunning = max(q.maxRunning, q.running)
		q.mu.Unlock()
		return seq, nil
	}
	w := &slotWaiter{ready: make(chan struct{})}
	elem := q.waiters.PushBack(w)
	q.maxWaiting = max(q.maxWaiting, q.waiters.Len())
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
			q.release()
		}
		return 0, cause
	default:
		q.waiters.Remove(elem)
		q.mu.Unlock()
		return 0, cause
	}
}

// release frees a slot, handing it to the head waiter if there is one.
func (q *slotQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if front := q.waiters.Front(); front != nil && !q.closed {
		w := q.waiters.Remove(front).(*slotWaiter)
		q.started++
		w.seq = q.started
		close(w.ready) // running is unchanged: the slot changes hands
		return
	}
	q.running--
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
	started                                  uint64
}

func (q *slotQueue) snapshot() queueSnapshot {
	q.mu.Lock()
	defer q.mu.Unlock()
	return queueSnapshot{
		running:    q.running,
		waiting:    q.waiters.Len(),
		maxRunning: q.maxRunning,
		maxWaiting: q.maxWaiting,
		started:    q.started,
	}
}
