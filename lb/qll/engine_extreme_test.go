package qll

import (
	"errors"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// An engine whose page reports a running count at the limit Parse accepts
// (2^53) with its KV cache full is full: it keeps what it runs of ours and
// a buffer, at most maxLimit slots like every other figure of its own, and
// the rest is held at the edge. (Its buffer, an eighth of the running
// count, was not bounded: 2^50 slots, and the full engine took every
// request while its peers' waiters would have waited.)
func TestAFullEngineReportingAHugeRunningCountIsBounded(t *testing.T) {
	a := newMetricsReplica(t, "vllm:num_requests_waiting 0\nvllm:num_requests_running 9007199254740992\nvllm:kv_cache_usage_perc 1\n")
	// No tick during the test: the first scrape and refreshes only.
	s := New(Config{QueueMaxSize: -1, EngineMetrics: modelmetrics.Config{Interval: time.Hour, MinRefresh: time.Millisecond}})
	runEngine(t, s)
	s.SetReplicas([]string{a.addr()})
	waitFor(t, "the first sample", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.replicas[a.addr()].eng.full
	})
	h := holding(t, s)
	for len(h.held) <= maxLimit {
		l, err := s.Acquire(t.Context())
		if errors.Is(err, lb.ErrQueueFull) {
			break // held at the edge: refused, no queue
		}
		if err != nil {
			t.Fatal(err)
		}
		h.held = append(h.held, l)
	}
	if n := len(h.held); n > maxLimit {
		t.Fatalf("a full engine took %d requests (slots %d), want at most %d", n, s.Snapshot().Replicas[0].Parallelism, maxLimit)
	}
}
