package qll

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// receive waits for one waiter's result; the bound only stops a broken
// test from hanging.
func receive(t *testing.T, ch <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no answer", what)
		return result{}
	}
}

// A reload that shortens queue_timeout applies to the requests already
// waiting (an operator lowers it because they wait too long): a request
// that has waited past the new bound is answered at once, not after the
// old one (20 minutes by default).
func TestReloadShortensTheQueueTimeoutOfWaitingRequests(t *testing.T) {
	s := New(Config{MaxConcurrency: 1, QueueTimeout: time.Hour})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1"})
	busy := mustAcquire(t, s)
	w := enqueue(t, s, context.Background(), 1)
	s.Configure(Config{MaxConcurrency: 1, QueueTimeout: time.Nanosecond})
	r := receive(t, w, "waiter after queue_timeout was cut to 1ns")
	if !errors.Is(r.err, lb.ErrQueueTimeout) {
		t.Fatalf("waiter got %v, want ErrQueueTimeout", r.err)
	}
	if c := s.Snapshot().Counters; c.TimedOut != 1 {
		t.Fatalf("counters %+v, want one timed out", c)
	}
	busy.Release(success(time.Millisecond))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight = %d", n)
	}
}

// A reload that lengthens queue_timeout leaves the waiting requests
// waiting: their new deadline is ahead.
func TestReloadLengthensTheQueueTimeoutOfWaitingRequests(t *testing.T) {
	s := New(Config{MaxConcurrency: 1, QueueTimeout: time.Hour})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1"})
	busy := mustAcquire(t, s)
	w := enqueue(t, s, context.Background(), 1)
	s.Configure(Config{MaxConcurrency: 1, QueueTimeout: 2 * time.Hour})
	busy.Release(success(time.Millisecond))
	r := receive(t, w, "waiter after the slot freed")
	if r.err != nil {
		t.Fatalf("waiter got %v, want the freed slot", r.err)
	}
	r.lease.Release(success(time.Millisecond))
	if c := s.Snapshot().Counters; c.TimedOut != 0 || c.Dispatched != 2 {
		t.Fatalf("counters %+v", c)
	}
}

// A reload that lowers queue_max_size bounds the queue at once: the
// oldest waiters beyond the new bound are evicted (503), as a full
// queue's are; a reload to -1 (no queue) refuses the rest (429). Before,
// the queue kept its old length until some later arrival.
func TestReloadBoundsTheQueueAtOnce(t *testing.T) {
	s := New(Config{MaxConcurrency: 1, QueueMaxSize: 10})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1"})
	busy := mustAcquire(t, s)
	w := enqueue(t, s, context.Background(), 5)
	s.Configure(Config{MaxConcurrency: 1, QueueMaxSize: 2})
	evicted := map[int]bool{}
	for i := 0; i < 3; i++ {
		r := receive(t, w, "evicted waiter")
		if r.id > 2 || !errors.Is(r.err, lb.ErrEvicted) {
			t.Fatalf("got waiter %d with %v, want the 3 oldest (0, 1, 2) evicted", r.id, r.err)
		}
		evicted[r.id] = true
	}
	if len(evicted) != 3 {
		t.Fatalf("evicted %v, want 0, 1 and 2", evicted)
	}
	if snap := s.Snapshot(); snap.QueueDepth != 2 || snap.Counters.Evicted != 3 {
		t.Fatalf("after the reload: depth %d counters %+v, want 2 waiting, 3 evicted", snap.QueueDepth, snap.Counters)
	}
	s.Configure(Config{MaxConcurrency: 1, QueueMaxSize: -1})
	for i := 0; i < 2; i++ {
		if r := receive(t, w, "waiter of a disabled queue"); !errors.Is(r.err, lb.ErrQueueFull) {
			t.Fatalf("waiter %d got %v, want ErrQueueFull", r.id, r.err)
		}
	}
	if d := s.Snapshot().QueueDepth; d != 0 {
		t.Fatalf("queue depth %d with queueing disabled", d)
	}
	busy.Release(success(time.Millisecond))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight = %d", n)
	}
}

func answered(status int, d time.Duration) lb.Outcome {
	return lb.Outcome{Kind: lb.Success, Latency: d, Total: d, Status: status}
}

// A replica that refuses requests fast (TGI's 429 "model is overloaded",
// a 404 for a model it does not serve) has not served them: its EWMA must
// not fall to the refusal's few milliseconds, or the overloaded replica
// looks fastest and is sent more.
func TestRefusalsTeachNoLatency(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusNotFound} {
		s := New(Config{LatencyThreshold: 3 * time.Second})
		s.SetReplicas([]string{"a:1"})
		l := mustAcquire(t, s)
		l.Release(answered(200, time.Second))
		for i := 0; i < 5; i++ {
			l := mustAcquire(t, s)
			l.Release(answered(status, time.Millisecond))
		}
		r := s.Snapshot().Replicas[0]
		if r.EWMASeconds != 1 {
			t.Fatalf("status %d: EWMA %.3fs after fast refusals, want 1s (a refusal is no service time)", status, r.EWMASeconds)
		}
		if r.Down || r.ConsecFails != 0 {
			t.Fatalf("status %d: the replica answered, it is not down: %+v", status, r)
		}
		s.Close()
	}
}

// A 429 from a replica says it is full at the concurrency it was sent
// at: the learned limit goes below it, never up (a fast 429 read as a
// fast success doubled the limit, so an overloaded TGI got ever more
// while the edge queue stayed empty).
func TestA429CutsTheLearnedLimit(t *testing.T) {
	s := New(Config{NoEngineMetrics: true})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1"})
	slots := func() int { return s.Snapshot().Replicas[0].Parallelism }
	// Grow it in slow start on requests served alongside each other
	// without slowing: 1 → 2 → 4 → 8.
	for slots() < 8 {
		n := slots()
		var ls []*Lease
		for i := 0; i < n; i++ {
			ls = append(ls, mustAcquire(t, s))
		}
		for _, l := range ls {
			l.Release(answered(200, time.Second))
		}
	}
	if n := slots(); n != 8 {
		t.Fatalf("slots = %d, want 8 to start from", n)
	}
	var ls []*Lease
	for i := 0; i < 8; i++ {
		ls = append(ls, mustAcquire(t, s))
	}
	ls[7].Release(answered(http.StatusTooManyRequests, time.Millisecond)) // sent at 8 in flight
	if n := slots(); n >= 8 {
		t.Fatalf("slots = %d after a 429 at 8 in flight, want fewer than 8", n)
	}
	for _, l := range ls[:7] {
		l.Release(answered(200, time.Second))
	}
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight = %d", n)
	}
}

// A reload that shortens fail_duration (or raises max_fails) applies to a
// replica already marked down: it comes back when the new settings say,
// not after the old down time (up to 16× the old fail_duration).
func TestReloadAppliesFailSettingsToADownReplica(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Config{FailDuration: time.Hour})
	t.Cleanup(s.Close)
	s.now = func() time.Time { return now }
	s.SetReplicas([]string{"a:1"})
	mustAcquire(t, s).Release(lb.Outcome{Kind: lb.Failure})
	if !s.Snapshot().Replicas[0].Down {
		t.Fatal("a failed replica is not down")
	}
	s.Configure(Config{FailDuration: time.Second})
	now = now.Add(2 * time.Second)
	if r := s.Snapshot().Replicas[0]; r.Down {
		t.Fatalf("2s after its failure, with fail_duration reloaded to 1s, the replica is still down: %+v", r)
	}
	l := mustAcquire(t, s) // its probe
	l.Release(lb.Outcome{Kind: lb.Failure})
	if !s.Snapshot().Replicas[0].Down {
		t.Fatal("a failed probe did not mark it down again")
	}
	s.Configure(Config{FailDuration: time.Second, MaxFails: 3})
	if r := s.Snapshot().Replicas[0]; r.Down {
		t.Fatalf("2 failures in a row with max_fails reloaded to 3: still down: %+v", r)
	}
}
