package sim

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// prefillLine models a replica whose engine runs one prefill at a time and
// pauses every decode step while a prefill runs (Config.PrefillBlocksDecode;
// an engine without chunked prefill). It is a FIFO token for prefills plus a
// busy-time account: busy(now) is the total time prefills have been running
// up to now. A decoding request measures its progress as elapsed time minus
// the busy time over the same span, so each of its decode chunks is
// stretched by the prefill time overlapping it; while a prefill runs it
// waits for the prefill's end (changed is closed and replaced at every end).
// No goroutine is involved: prefills and decoders wait on their own timers
// and on channels.
type prefillLine struct {
	now func() time.Time // time.Now; a fake clock in tests

	mu          sync.Mutex
	active      bool      // a prefill holds the token
	activeStart time.Time // when the current prefill started
	busyDone    time.Duration
	changed     chan struct{} // closed (and replaced) when a prefill ends
	waiters     list.List     // of *prefillWaiter, FIFO

	prefilling    int           // prefills running now (0 or 1)
	maxPrefilling int           // largest number of prefills seen running at once
	prefills      uint64        // prefills started
	stall         time.Duration // total decode pause, summed over requests
}

type prefillWaiter struct {
	ready chan struct{} // closed when the token is handed over
}

func newPrefillLine() *prefillLine {
	return &prefillLine{now: time.Now, changed: make(chan struct{})}
}

// startLocked gives the token to a new prefill.
func (pl *prefillLine) startLocked(now time.Time) {
	pl.active = true
	pl.activeStart = now
	pl.prefills++
	pl.prefilling++
	pl.maxPrefilling = max(pl.maxPrefilling, pl.prefilling)
}

// acquire waits, in FIFO order, until no other prefill runs on the replica
// and starts the caller's. It fails when ctx ends or done is closed; the
// caller then holds nothing. Otherwise the caller must call release.
func (pl *prefillLine) acquire(ctx context.Context, done <-chan struct{}) error {
	pl.mu.Lock()
	if !pl.active && pl.waiters.Len() == 0 {
		pl.startLocked(pl.now())
		pl.mu.Unlock()
		return nil
	}
	w := &prefillWaiter{ready: make(chan struct{})}
	elem := pl.waiters.PushBack(w)
	pl.mu.Unlock()

	var cause error
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		cause = ctx.Err()
	case <-done:
		cause = errClosed
	}
	pl.mu.Lock()
	select {
	case <-w.ready:
		// Handed over concurrently with the cancellation: pass it on.
		pl.mu.Unlock()
		pl.release()
	default:
		pl.waiters.Remove(elem)
		pl.mu.Unlock()
	}
	return cause
}

// release ends the caller's prefill (done or cancelled) and starts the next
// waiting one, if any.
func (pl *prefillLine) release() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	now := pl.now()
	pl.busyDone += now.Sub(pl.activeStart)
	pl.active = false
	pl.prefilling--
	close(pl.changed)
	pl.changed = make(chan struct{})
	if front := pl.waiters.Front(); front != nil {
		w := pl.waiters.Remove(front).(*prefillWaiter)
		pl.startLocked(now)
		close(w.ready)
	}
}

// mark reads the clock and the busy time, whether a prefill runs now, and
// the channel closed when it ends.
func (pl *prefillLine) mark() (now time.Time, busy time.Duration, active bool, changed <-chan struct{}) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	now = pl.now()
	busy = pl.busyDone
	if pl.active {
		busy += now.Sub(pl.activeStart)
	}
	return now, busy, pl.active, pl.changed
}

type prefillLineStats struct {
	prefilling, waiting, maxPrefilling int
	prefills                           uint64
	stall                              time.Duration
}

func (pl *prefillLine) stats() prefillLineStats {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return prefillLineStats{
		prefilling:    pl.prefilling,
		waiting:       pl.waiters.Len(),
		maxPrefilling: pl.maxPrefilling,
		prefills:      pl.prefills,
		stall:         pl.stall,
	}
}

// decodeClock is one request's position on its replica's prefill line
// during its decode phase.
type decodeClock struct {
	started bool
	busy    time.Duration // the line's busy time when the last decode wait ended
	stall   time.Duration // this request's total decode pause so far
}

// forever is a wait with no timeout of its own.
const forever = time.Duration(1 << 62)

// decodeWait waits for d of decode progress, pausing while other requests'
// prefills run. sleep is the request's sleeper (sleeper.sleep; a fake in
// tests): it waits for its duration, or until its channel is closed.
//
// Progress is elapsed time minus the prefill busy time over the same span.
// Prefill time that ran since the previous decode wait of the request ended
// (while its chunk was being sent) is added to d, so that the request's
// whole decode phase is stretched by exactly the prefill time overlapping
// it; that time is also added to the request's and the line's stall
// accounts. With d == 0 and steps == 0 (the first token, which the prefill
// itself produces) nothing is waited for.
func (pl *prefillLine) decodeWait(sleep func(time.Duration, <-chan struct{}) error, dc *decodeClock, d time.Duration, steps int) error {
	t0, b0, active, changed := pl.mark()
	if !dc.started {
		dc.started = true
		dc.busy = b0
	}
	need := d + (b0 - dc.busy)
	startBusy := dc.busy
	defer func() {
		dc.stall += dc.busy - startBusy
		pl.mu.Lock()
		pl.stall += dc.busy - startBusy
		pl.mu.Unlock()
	}()
	if steps == 0 && need <= 0 {
		dc.busy = b0
		return sleep(0, nil)
	}
	for {
		if active {
			// Paused: no decode progress until the prefill ends.
			if err := sleep(forever, changed); err != nil {
				_, dc.busy, _, _ = pl.mark()
				return err
			}
			t0, b0, active, changed = pl.mark()
			continue
		}
		err := sleep(max(need, 0), nil)
		t1, b1, a1, c1 := pl.mark()
		dc.busy = b1
		if err != nil {
			return err
		}
		need -= t1.Sub(t0) - (b1 - b0)
		if need <= 0 {
			return nil
		}
		t0, b0, active, changed = t1, b1, a1, c1
	}
}
