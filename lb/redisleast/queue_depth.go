package redisleast

import (
	"context"
	"errors"
	"fmt"
)

// QueueDepth is the queueing mode's queue as a health report shows it.
type QueueDepth struct {
	// Queued counts the pool's requests waiting in the global queue, every
	// instance's ({tag}:waiters: live waiters only, not the cancelled
	// tokens the list may still hold), read from Redis when asked; -1
	// when it could not be (Err says why).
	Queued int64
	Err    error
	// Waiting counts this instance's requests waiting now.
	Waiting int
}

// errQueueBreakerOpen: health does not ask Redis while the breaker is open
// (the placeholder client fails every call; requests are not queued
// globally meanwhile).
var errQueueBreakerOpen = errors.New("Redis unavailable (circuit breaker open): serving from this instance's own counts")

// QueueDepth reads the global queue's length now (Stats.Queued is the
// background loop's last read), bounded by ReadTimeout; ok is false when
// the store is not in queueing mode. The read goes around the breaker and
// the call counters: a health poller must not trip or skew them.
func (s *Store) QueueDepth(ctx context.Context) (d QueueDepth, ok bool) {
	q, ok := s.mode.(*globalQueue)
	if !ok {
		return QueueDepth{}, false
	}
	d = QueueDepth{Queued: -1, Waiting: q.waiters.len()}
	if s.br.isOpen() {
		d.Err = errQueueBreakerOpen
		return d, true
	}
	cctx, cancel := context.WithTimeout(ctx, s.conf().ReadTimeout)
	defer cancel()
	c := s.rc()
	n, err := c.Do(cctx, c.B().Hlen().Key(s.k.waiters).Build()).AsInt64()
	if err != nil {
		d.Err = fmt.Errorf("reading the queue length from Redis: %w", err)
		return d, true
	}
	d.Queued = n
	return d, true
}
