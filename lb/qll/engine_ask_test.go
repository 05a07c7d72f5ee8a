package qll

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// metricsReplica serves a fixed metrics body and counts its scrapes.
type metricsReplica struct {
	*httptest.Server
	hits atomic.Int64
}

func newMetricsReplica(t *testing.T, body string) *metricsReplica {
	m := &metricsReplica{}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.hits.Add(1)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *metricsReplica) addr() string { return strings.TrimPrefix(m.URL, "http://") }

// runEngine reads the replicas' metrics for s until the test ends.
func runEngine(t *testing.T, s *State) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// While requests wait at the edge only the replicas holding them whose
// fresh sample could give them slots are scraped again: not one that
// exports no queue (its samples never decide its slots), nor one that is
// down (no slot would make it take a request).
func TestWaitersRefreshOnlyTheReplicasThatCouldTakeThem(t *testing.T) {
	queue := "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"
	a := newMetricsReplica(t, queue)
	b := newMetricsReplica(t, "vllm:kv_cache_usage_perc 0.1\n") // no queue
	c := newMetricsReplica(t, queue)
	// No tick during the test: only the first scrapes and refreshes.
	s := New(Config{EngineMetrics: modelmetrics.Config{Interval: time.Hour, MinRefresh: time.Millisecond}})
	runEngine(t, s)
	s.SetReplicas([]string{a.addr(), b.addr(), c.addr()})
	waitFor(t, "the first samples", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return b.hits.Load() == 1 && !s.replicas[a.addr()].eng.until.IsZero() && !s.replicas[c.addr()].eng.until.IsZero()
	})

	// One request on each (one slot each while nothing has answered); c
	// fails its own and is down.
	leases := map[string]*Lease{}
	for range 3 {
		l := mustAcquire(t, s)
		leases[l.Addr] = l
	}
	leases[c.addr()].Release(lb.Outcome{Kind: lb.Failure})
	defer leases[a.addr()].Release(success(time.Millisecond))
	defer leases[b.addr()].Release(success(time.Millisecond))
	if snap := s.Snapshot(); !snap.Replicas[2].Down {
		t.Fatalf("c not down: %+v", snap.Replicas[2])
	}

	// a and c were read again when their one request took their slot
	// (TestAProbedEngineAtItsSlotsIsReadAgain); what counts is after.
	waitFor(t, "c's read at its slots", func() bool { return c.hits.Load() >= 2 })
	time.Sleep(20 * time.Millisecond)
	nc0, na0 := c.hits.Load(), a.hits.Load()

	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	enqueue(t, s, wctx, 1)
	waitFor(t, "a refreshed", func() bool { return a.hits.Load() > na0 })
	time.Sleep(100 * time.Millisecond) // a round asking for all would have reached b and c by now
	if nb, nc := b.hits.Load(), c.hits.Load(); nb != 1 || nc != nc0 {
		t.Fatalf("scrapes of b %d, of c %d: want 1 and %d (none since the waiter came), only a could take the waiter", nb, nc, nc0)
	}
}

// A replica whose sample shows requests waiting in it is asked again
// (at most every MinRefresh), with no request waiting at the edge: only
// samples close together tell requests waiting for a step from a full
// engine, and a replica held at what it runs is let go as soon as its
// queue empties. One with nothing waiting is left to the interval.
func TestAnEngineWithRequestsWaitingIsAskedAgain(t *testing.T) {
	a := newMetricsReplica(t, "vllm:num_requests_waiting 1\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.3\n")
	b := newMetricsReplica(t, "vllm:num_requests_waiting 0\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.3\n")
	// No tick during the test: only the first scrapes and refreshes.
	s := New(Config{EngineMetrics: modelmetrics.Config{Interval: time.Hour, MinRefresh: time.Millisecond}})
	runEngine(t, s)
	s.SetReplicas([]string{a.addr(), b.addr()})
	waitFor(t, "a asked again", func() bool { return a.hits.Load() >= 3 })
	// b's first scrape may still be under way on a busy machine (CI:
	// "scrapes of b 0"); it must come, and be the only one.
	waitFor(t, "b's first scrape", func() bool { return b.hits.Load() >= 1 })
	if nb := b.hits.Load(); nb != 1 {
		t.Fatalf("scrapes of b %d: want 1 (the first), nothing waits in it", nb)
	}
}

// A batching engine whose slots are all taken is read again at once,
// with nothing waiting at the edge: only a sample gives it more slots,
// and until then its peers take its share. Left to the interval, an
// engine once cut to what it ran (taken for full on its first, slow
// steps) waited a second per sample at a quarter more slots each while
// its peers filled up to their KV bound: at R = 4 and real time, TTFT
// p99 0.69 s against round robin's 0.56 s.
func TestABatchingEngineAtItsSlotsIsReadAgain(t *testing.T) {
	batch := "vllm:num_requests_waiting 0\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.3\n"
	a, b := newMetricsReplica(t, batch), newMetricsReplica(t, batch)
	// No tick during the test: only the first scrapes and refreshes.
	s := New(Config{EngineMetrics: modelmetrics.Config{Interval: time.Hour, MinRefresh: time.Millisecond}})
	runEngine(t, s)
	s.SetReplicas([]string{a.addr(), b.addr()})
	waitFor(t, "the first samples", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.replicas[a.addr()].eng.batching && s.replicas[b.addr()].eng.batching
	})
	slots := s.Snapshot().Replicas[0].Parallelism // twice the 4 it runs
	var held []*Lease
	defer func() {
		for _, l := range held {
			l.Release(success(time.Millisecond))
		}
	}()
	for range slots { // a at its slots, b not
		s.mu.Lock()
		r := s.pickLocked(s.now(), []string{b.addr()})
		l := s.assignLocked(r, s.now(), 0)
		s.mu.Unlock()
		held = append(held, l)
	}
	waitFor(t, "a read again", func() bool { return a.hits.Load() >= 2 })
	time.Sleep(50 * time.Millisecond) // a refresh of b would have come by now
	if nb := b.hits.Load(); nb != 1 {
		t.Fatalf("scrapes of b %d: want 1 (the first), it has free slots", nb)
	}
	if got := s.Snapshot().Replicas[0]; got.Parallelism <= slots {
		t.Fatalf("a's slots %d after its fresh sample, want more than %d", got.Parallelism, slots)
	}
}

// An engine not yet known to batch whose slots are all taken (its probe
// included) is read again at once, with nothing waiting at the edge: its
// next sample is what shows it batching and gives it more slots. Left to
// the interval, the calibrated engines of R = 4 learned they batch a
// scrape apart, a second; the one read first took every arrival in the
// meantime (four in a row, TTFT 0.9-1.0 s against round robin's 0.6-0.7)
// while the others sat at their probe.
func TestAProbedEngineAtItsSlotsIsReadAgain(t *testing.T) {
	var running atomic.Int64 // the engine runs what Sluice holds on it
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running %d\nvllm:kv_cache_usage_perc 0.1\n", running.Load())
	}))
	t.Cleanup(srv.Close)
	a := strings.TrimPrefix(srv.URL, "http://")
	b := newMetricsReplica(t, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n")
	// No tick during the test: only the first scrapes and refreshes.
	s := New(Config{EngineMetrics: modelmetrics.Config{Interval: time.Hour, MinRefresh: time.Millisecond}})
	runEngine(t, s)
	s.SetReplicas([]string{a, b.addr()})
	waitFor(t, "the first samples", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.replicas[a].eng.until.IsZero() && !s.replicas[b.addr()].eng.until.IsZero()
	})
	var held []*Lease
	defer func() {
		for _, l := range held {
			l.Release(success(time.Millisecond))
		}
	}()
	// Requests to a, one at a time, each running in the engine once taken,
	// until a sample shows it batching; b is kept out.
	take := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		r := s.pickLocked(s.now(), []string{b.addr()})
		if r == nil {
			return false
		}
		held = append(held, s.assignLocked(r, s.now(), 0))
		running.Add(1)
		return true
	}
	waitFor(t, "a known to batch", func() bool {
		take()
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.replicas[a].eng.batching
	})
	if slots := s.Snapshot().Replicas[0].Parallelism; slots < 4 {
		t.Fatalf("a's slots %d once known to batch with %d running, want at least 4", slots, running.Load())
	}
	if nb := b.hits.Load(); nb != 1 {
		t.Fatalf("scrapes of b %d: want 1 (the first), it holds nothing", nb)
	}
}
