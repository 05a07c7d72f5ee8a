package sim

import (
	"context"
	"testing"
	"time"
)

// TestSlotQueuePeakInFlight: maxInFlight is the largest running + waiting
// held at once, a high-water mark; waited, maxWait and queued cover the
// requests granted a slot from the wait list.
func TestSlotQueuePeakInFlight(t *testing.T) {
	q := newSlotQueue(1, 0)
	bg := context.Background()
	acquire := func(ctx context.Context) <-chan error {
		ch := make(chan error, 1)
		go func() { _, err := q.acquire(ctx, nil); ch <- err }()
		return ch
	}
	waitWaiting := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, w := q.counts(); w == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting never reached %d", n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	peak := func() int { return q.snapshot().maxInFlight }

	// One at a time, never overlapping: the peak stays at 1, nothing waited.
	for range 3 {
		if _, err := q.acquire(bg, nil); err != nil {
			t.Fatal(err)
		}
		q.release()
	}
	if s := q.snapshot(); s.maxInFlight != 1 || s.waited != 0 || s.queued != 0 {
		t.Fatalf("sequential: maxInFlight %d waited %v queued %d, want 1, 0, 0", s.maxInFlight, s.waited, s.queued)
	}

	// 1 running + 2 waiting: 3 held at once.
	if _, err := q.acquire(bg, nil); err != nil {
		t.Fatal(err)
	}
	w1 := acquire(bg)
	waitWaiting(1)
	ctx, cancel := context.WithCancel(bg)
	w2 := acquire(ctx)
	waitWaiting(2)
	if got := peak(); got != 3 {
		t.Fatalf("maxInFlight = %d with 1 running + 2 waiting, want 3", got)
	}
	// A waiter giving up leaves the queue; the peak is a high-water mark.
	cancel()
	if err := <-w2; err == nil {
		t.Fatal("cancelled waiter got a slot")
	}
	waitWaiting(1)
	time.Sleep(20 * time.Millisecond)
	q.release() // hands the slot to w1, which waited ≥ 20 ms
	if err := <-w1; err != nil {
		t.Fatal(err)
	}
	s := q.snapshot()
	if s.running != 1 || s.waiting != 0 || s.maxInFlight != 3 {
		t.Fatalf("after grant: %+v, want running 1, waiting 0, maxInFlight 3", s)
	}
	if s.waited < 20*time.Millisecond || s.waited > 5*time.Second || s.maxWait != s.waited || s.queued != 1 {
		t.Fatalf("waited %v, maxWait %v, queued %d: want ≥ 20ms, the same, 1 (the granted waiter only, not the one that gave up)",
			s.waited, s.maxWait, s.queued)
	}
	q.release()

}
