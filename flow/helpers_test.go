package flow

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeClock runs AfterFunc callbacks when the test advances it, never on
// its own.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *fakeClock
	at   time.Time
	f    func()
	done bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

// Advance moves time on and runs the callbacks that fall due, in this
// goroutine, without holding the clock's lock.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for _, t := range c.timers {
		if !t.done && !t.at.After(c.now) {
			t.done = true
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// gate is a detector the test opens and closes.
type gate struct{ closed atomic.Bool }

func (g *gate) Saturation(InFlight) Verdict {
	if g.closed.Load() {
		return Verdict{Load: 1}
	}
	return Verdict{}
}

func closedGate() *gate {
	g := &gate{}
	g.closed.Store(true)
	return g
}

// limit admits n requests in flight; the test changes n without telling
// the controller, as replica metrics do.
type limit struct{ n atomic.Int64 }

func (l *limit) Saturation(in InFlight) Verdict {
	if in.Requests < l.n.Load() {
		return Verdict{}
	}
	return Verdict{Load: 1}
}

// slots is the concurrency detector over the whole pool: n requests in flight.
func slots(n int64) *ConcurrencyDetector {
	return NewConcurrencyDetector(DetectorConfig{Type: DetectorConcurrency, MaxConcurrency: n}, nil)
}

type result struct {
	req    Request
	ticket *Ticket
	err    error
}

// enqueueAsync runs Enqueue in a goroutine; the result arrives on out.
func enqueueAsync(ctx context.Context, c *Controller, req Request, out chan<- result) {
	go func() {
		t, err := c.Enqueue(ctx, req)
		out <- result{req, t, err}
	}()
}

// eventually polls cond with a generous deadline: only to avoid hanging,
// never as a timing assertion.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func waitQueued(t *testing.T, c *Controller, n int) {
	t.Helper()
	eventually(t, "queued requests", func() bool { return c.Snapshot().Queued == n })
}

func newController(t *testing.T, cfg Config, det SaturationDetector, opts ...Option) *Controller {
	t.Helper()
	c, err := New(cfg, det, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// mustNotReceive checks nothing has arrived on ch yet (no waiting involved:
// a result that should not exist must not be there now).
func mustNotReceive(t *testing.T, ch <-chan result, why string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: got a result for %+v (err %v)", why, r.req, r.err)
	default:
	}
}
