package qll

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// A 4xx answer (a 404 for a model the replica does not serve, a 400)
// feeds neither the EWMA nor the learned limit, and that includes its
// first byte: in slow start a first byte doubles the limit before the
// status is known, so rounds of fast 404s answered alongside each other
// doubled a replica's slots every round (1 → 32 in five rounds), and the
// first real burst went 32 at once into what may be a one-at-a-time
// server. Served answers still grow it as before.
func TestA4xxFirstByteGrowsNoLimit(t *testing.T) {
	s := New(Config{NoEngineMetrics: true})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1"})
	slots := func() int { return s.Snapshot().Replicas[0].Parallelism }
	round := func(status int) {
		var ls []*Lease
		for range slots() {
			ls = append(ls, mustAcquire(t, s))
		}
		for _, l := range ls {
			l.FirstByte(time.Millisecond)
		}
		for _, l := range ls {
			l.Release(answered(status, time.Millisecond))
		}
	}
	for i := range 5 {
		round(http.StatusNotFound)
		if n := slots(); n != 1 {
			t.Fatalf("slots = %d after %d rounds of 404s, want 1 (a refusal is no sign of room)", n, i+1)
		}
	}
	round(http.StatusOK)
	if n := slots(); n != 2 {
		t.Fatalf("slots = %d after a served request's first byte in slow start, want 2", n)
	}
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight = %d", n)
	}
}

// Every waiter leaves the queue exactly once, however its ways out race:
// dispatch (releases), its own timeout (queue_timeout reloaded to 1ns and
// back), eviction (queue_max_size reloaded down), its client leaving, and
// Close. Counted: each Acquire returns once; Dispatched + Evicted +
// TimedOut + Cancelled + Refused is the number of Acquires; every
// dispatched lease is released once (abandon hands back the ones that
// raced a cancellation); each error returned is one its counter counted.
func TestEveryWaiterLeavesOnceWhileReloadsRaceItsWaysOut(t *testing.T) {
	s := New(Config{MaxConcurrency: 2, Parallelism: 2, QueueMaxSize: 50, QueueTimeout: time.Hour, NoEngineMetrics: true})
	s.SetReplicas([]string{"a:1", "b:1"})
	const workers, each = 8, 150
	type tally struct{ leases, evicted, timedOut, cancelled, full, shutdown, other int }
	tallies := make(chan tally, workers)
	leases := make(chan *Lease, workers*each)
	stop := make(chan struct{})
	reloads := make(chan struct{})
	go func() { // reloads: timeout 1ns / 1h, bound 50 / 3 / -1
		defer close(reloads)
		cfgs := []Config{
			{QueueMaxSize: 50, QueueTimeout: time.Hour},
			{QueueMaxSize: 3, QueueTimeout: time.Hour},
			{QueueMaxSize: 50, QueueTimeout: time.Nanosecond},
			{QueueMaxSize: -1, QueueTimeout: time.Hour},
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			c := cfgs[i%len(cfgs)]
			c.MaxConcurrency, c.Parallelism, c.NoEngineMetrics = 2, 2, true
			s.Configure(c)
		}
	}()
	releaser := make(chan struct{})
	go func() { // releases every lease handed out
		defer close(releaser)
		for l := range leases {
			if !l.Release(success(time.Millisecond)) {
				t.Error("a lease handed out was already released")
			}
		}
	}()
	done := make(chan struct{})
	for w := range workers {
		go func() {
			var c tally
			defer func() { tallies <- c }()
			for i := range each {
				ctx, cancel := context.WithCancel(context.Background())
				if (w+i)%3 == 0 {
					go cancel() // leaves at some point of its wait
				}
				l, err := s.Acquire(ctx)
				cancel()
				switch {
				case err == nil:
					c.leases++
					leases <- l
				case errors.Is(err, lb.ErrEvicted):
					c.evicted++
				case errors.Is(err, lb.ErrQueueTimeout):
					c.timedOut++
				case errors.Is(err, context.Canceled):
					c.cancelled++
				case errors.Is(err, lb.ErrQueueFull):
					c.full++
				case errors.Is(err, lb.ErrShutdown):
					c.shutdown++
				default:
					c.other++
					t.Errorf("Acquire: %v", err)
				}
			}
		}()
	}
	go func() {
		var sum tally
		for range workers {
			c := <-tallies
			sum.leases += c.leases
			sum.evicted += c.evicted
			sum.timedOut += c.timedOut
			sum.cancelled += c.cancelled
			sum.full += c.full
			sum.shutdown += c.shutdown
			sum.other += c.other
		}
		close(stop)
		<-reloads
		close(leases)
		<-releaser
		s.Close()
		cnt := s.Snapshot().Counters
		// Each request is counted once, by the first of its ways out, except
		// one whose context ended before Acquire began (it never queued:
		// Acquire returns ctx.Err() and counts nothing). The caller of a
		// request resolved as its client left sees ctx.Err() too, so those
		// uncounted ones are among the returned cancels the Cancelled
		// counter does not hold (a CI run: 2 of 1,200).
		got := int(cnt.Dispatched + cnt.Evicted + cnt.TimedOut + cnt.Cancelled + cnt.Refused)
		if early := workers*each - got; early < 0 || early > sum.cancelled-int(cnt.Cancelled) {
			t.Errorf("counters %+v add up to %d ways out for %d requests (%d returned cancelled)", cnt, got, workers*each, sum.cancelled)
		}
		if cnt.Dispatched != cnt.Released {
			t.Errorf("dispatched %d, released %d", cnt.Dispatched, cnt.Released)
		}
		if uint64(sum.leases) > cnt.Dispatched || uint64(sum.evicted) > cnt.Evicted ||
			uint64(sum.timedOut) > cnt.TimedOut || uint64(sum.full) > cnt.Refused {
			t.Errorf("returned %+v, counted %+v", sum, cnt)
		}
		if n := s.TotalInFlight(); n != 0 || s.Snapshot().QueueDepth != 0 {
			t.Errorf("in flight %d, queue %d at the end", n, s.Snapshot().QueueDepth)
		}
		t.Logf("returned %+v; counted %+v", sum, cnt)
		close(done)
	}()
	<-done
}

// A 429 storm takes the learned limit to 1 (each refusal sent at k in
// flight puts it below k), yet the replica gets its slots back once it
// serves again: each request served at the limit with room adds one.
func TestA429StormLeavesAWayBackUp(t *testing.T) {
	c := newConcurrencyLimit()
	c.limit = 16
	for k := 16; k >= 1; k-- { // refused at every concurrency on the way down
		for range 50 {
			c.refused(k)
		}
	}
	if c.slots() != 1 || c.growing {
		t.Fatalf("after the storm: %d slots, growing %v; want 1, not growing", c.slots(), c.growing)
	}
	// It recovers: served alone, then at its limit each time, no slower.
	c.observe(plainKind, 1, 1, 1, 0, false)
	for c.slots() < 8 {
		before := c.slots()
		c.observe(plainKind, before, 1, 1, 0, false)
		if c.slots() <= before {
			t.Fatalf("served at its limit %d with no slowdown, the limit stays %.2f", before, c.limit)
		}
	}
}
