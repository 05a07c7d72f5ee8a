package redisleast

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// A queued pick tells its lb.Waiter (the adapter, which then reads the
// client's body) with a context that ends once the pick leaves the queue
// unserved: the read is cut there, and a pick whose read was cut must not
// be dispatched, even if the queue handed it a slot meanwhile.

// readingWaiter stands for the adapter's body read: it blocks until left
// ends (cut) or, never cut, gives up after a while so the test can fail;
// then during runs (the queue hands the pick a slot meanwhile).
type readingWaiter struct {
	block  bool
	during func()
	cut    atomic.Bool
	left   atomic.Pointer[context.Context]
}

func (w *readingWaiter) Waiting(left context.Context) {
	w.left.Store(&left)
	if w.block {
		select {
		case <-left.Done():
			w.cut.Store(true)
		case <-time.After(2 * time.Second): // never cut: let the pick go on and fail the test
		}
	}
	if w.during != nil {
		w.during()
	}
}

// requestRecords lists the request records of s's instance hash.
func requestRecords(t *testing.T, c rueidis.Client, s *Store) map[string]string {
	t.Helper()
	kv, err := c.Do(context.Background(), c.B().Hgetall().Key(s.ident.Load().inst).Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	delete(kv, "#")
	delete(kv, "!")
	return kv
}

// leftClean waits until nothing of s's queued requests is left: no count
// on r, no queue entry, waiter, assignment or record.
func leftClean(t *testing.T, c rueidis.Client, s *Store) {
	t.Helper()
	waitFor(t, "the count, the queue and the records to be empty", func() bool {
		counts, err := s.Counts(context.Background())
		return err == nil && counts["r"] == 0 && queueEmpty(t, s, c) && len(requestRecords(t, c, s)) == 0 && s.Stats().Waiting == 0
	})
}

// handOverDuringRead: a waiter whose read hands it the held slot, and
// returns once Redis shows the hand-over.
func handOverDuringRead(t *testing.T, c rueidis.Client, s *Store, held *Lease) *readingWaiter {
	return &readingWaiter{block: true, during: func() {
		held.Release(ok) // the queue hands the slot to the waiting pick
		waitFor(t, "the slot handed to the queued pick", func() bool { return hlen(t, c, s.k.assigned) == 1 })
	}}
}

func TestQueuedPickCutAtItsDeadlineGivesBackASlotHandedMeanwhile(t *testing.T) {
	addr := redistest.Addr(t)
	cfg := queueConfig(t, addr)
	cfg.QueueTimeout = 100 * time.Millisecond
	s := newStore(t, cfg, "p")
	c := rawFor(t, single(addr))
	if err := s.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	w := handOverDuringRead(t, c, s, sel(t, s, "r"))
	l, err := s.Pick(context.Background(), &lb.Request{Waiter: w})
	if l != nil || !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("pick past its queue deadline, handed a slot during its read: lease on %q, err %v; want ErrQueueTimeout and no lease", replicaOf(l), err)
	}
	if !w.cut.Load() {
		t.Fatal("the queued pick's read was not cut at its queue deadline")
	}
	leftClean(t, c, s)
	if st := s.Stats(); st.QueueTimeouts != 1 || st.QueuedTotal != 1 {
		t.Fatalf("stats %+v: want one queued request, timed out", st)
	}
}

func TestQueuedPickWhoseClientLeavesDuringItsReadGivesBackASlotHandedMeanwhile(t *testing.T) {
	addr := redistest.Addr(t)
	s := newStore(t, queueConfig(t, addr), "p") // queue_timeout 20 s
	c := rawFor(t, single(addr))
	if err := s.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := handOverDuringRead(t, c, s, sel(t, s, "r"))
	l, err := s.Pick(ctx, &lb.Request{Waiter: waiterFunc(func(left context.Context) {
		cancel() // the client leaves while its body is read
		w.Waiting(left)
	})})
	if !w.cut.Load() {
		t.Fatal("the queued pick's read was not cut when its client left")
	}
	if l != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("pick whose client left: lease on %q, err %v; want context.Canceled and no lease", replicaOf(l), err)
	}
	leftClean(t, c, s)
}

// The read's deadline follows a reload of queue_timeout, as await's does.
func TestQueuedPickReadIsCutAtAQueueTimeoutLoweredDuringIt(t *testing.T) {
	addr := redistest.Addr(t)
	cfg := queueConfig(t, addr)
	cfg.QueueTimeout = time.Hour
	s := newStore(t, cfg, "p")
	c := rawFor(t, single(addr))
	if err := s.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, s, "r")
	w := &readingWaiter{block: true}
	l, err := s.Pick(context.Background(), &lb.Request{Waiter: waiterFunc(func(left context.Context) {
		cfg.QueueTimeout = 50 * time.Millisecond
		if err := s.Configure(cfg); err != nil {
			t.Error(err)
		}
		w.Waiting(left)
	})})
	if !w.cut.Load() || l != nil || !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("queue_timeout 1h → 50ms during the read: cut %v, lease on %q, err %v; want cut, ErrQueueTimeout", w.cut.Load(), replicaOf(l), err)
	}
	held.Release(ok)
	leftClean(t, c, s)
}

// A read that ends first leaves the pick waiting as before: it is
// dispatched, and its context never ends for it.
func TestQueuedPickWhoseReadEndsFirstIsDispatched(t *testing.T) {
	addr := redistest.Addr(t)
	s := newStore(t, queueConfig(t, addr), "p")
	c := rawFor(t, single(addr))
	if err := s.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, s, "r")
	w := &readingWaiter{}
	out := make(chan got, 1)
	req := &lb.Request{Waiter: w}
	pickWaits(t, c, s, "waiter", out, req)
	held.Release(ok)
	g := next(t, out, "the queued pick")
	if g.err != nil || g.l == nil || g.l.Addr != "r" || req.Reason != lb.ReasonQueued {
		t.Fatalf("pick: lease %v (%s), err %v; want r, queued", g.l, req.Reason, g.err)
	}
	if left := w.left.Load(); left == nil || (*left).Err() != nil {
		t.Fatal("the waiter's context ended though its pick got a replica")
	}
	g.l.Release(ok)
	leftClean(t, c, s)
}

type waiterFunc func(left context.Context)

func (f waiterFunc) Waiting(left context.Context) { f(left) }

// replicaOf is l's replica, "" for no lease.
func replicaOf(l lb.Lease) string {
	if l == nil {
		return ""
	}
	return l.Replica()
}
