package caddymodule

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/qll"
)

// A replica that answers 429 at once (TGI's "model is overloaded") has
// served nothing: through Caddy's real reverse_proxy its refusals must
// leave the replica's latency where its served requests put it. Read as
// fast successes they made the overloaded replica the pool's fastest.
func TestQLLRefusalsThroughTheProxyTeachNoLatency(t *testing.T) {
	var refuse atomic.Bool
	dial := replicaServing(t, func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() {
			http.Error(w, `{"error":"Model is overloaded"}`, http.StatusTooManyRequests)
			return
		}
		time.Sleep(20 * time.Millisecond) // a served request takes longer than a refusal
		answerOK(w, r)
	})
	pool := freshPoolName("qll-429")
	url := startProxy(t, []map[string]any{qllProxy(pool, dial)}, nil)
	if got := statusOf(t, completion(t, http.MethodPost, url)); got != http.StatusOK {
		t.Fatalf("served request: %d", got)
	}
	served := qllReplica(t, pool, dial)
	if !served.Tried {
		t.Fatalf("the served request taught nothing: %+v", served)
	}
	refuse.Store(true)
	const n = 5
	for i := 0; i < n; i++ {
		if got := statusOf(t, completion(t, http.MethodPost, url)); got != http.StatusTooManyRequests {
			t.Fatalf("refused request: %d, want the replica's 429", got)
		}
	}
	after := released(t, pool, dial, served.Dispatched+n)
	if after.EWMASeconds != served.EWMASeconds {
		t.Fatalf("EWMA %.4fs after %d fast 429s, want %.4fs as the served request left it", after.EWMASeconds, n, served.EWMASeconds)
	}
	if after.Down || after.Failures != 0 {
		t.Fatalf("a replica that answers 429 is busy, not down: %+v", after)
	}
}

// released is pool's view of the replica at dial once it has been sent
// dispatched requests and released them all.
func released(t *testing.T, pool, dial string, dispatched uint64) qll.ReplicaSnapshot {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // bounds a broken release; no timing asserted
	for {
		if st := pickersOf[*qll.State]("queued_least_latency")[pool]; st != nil {
			for _, r := range st.Snapshot().Replicas {
				if r.Addr == dial && r.InFlight == 0 && r.Dispatched >= dispatched {
					return r
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: replica %s not released after %d requests", pool, dial, dispatched)
		}
		time.Sleep(time.Millisecond)
	}
}
