package redisgate

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redistest"
)

// TestRolledBackRedisGrantsNoMoreThanCapacity: Redis loses the pool's
// records while requests run (restarted empty, or from a snapshot taken
// before they were granted). The instance that asks first must not be
// granted the capacity the others still use: until every live instance
// has renewed (and so re-published what it holds) no one is granted
// more than it already has.
func TestRolledBackRedisGrantsNoMoreThanCapacity(t *testing.T) {
	for _, loss := range []string{"restarted empty", "older snapshot"} {
		t.Run(loss, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, tg redistest.Target) {
				const capacity = 4
				pool := uniquePool(t)
				cl := redistest.Client(t, tg.Conn)
				k := KeysFor("", pool)
				// Renewals every second: the window in which only the
				// waiting instance talks to Redis is wide enough to see.
				slowRenew := func(c *Config) { c.LeaseTTL = 3 * time.Second }
				a := newInstance(t, tg.Conn, pool, "a", capacity, slowRenew)
				b := newInstance(t, tg.Conn, pool, "b", capacity, slowRenew)

				var inFlight, peak atomic.Int64
				run := func(in *instance, hold <-chan struct{}) {
					tk, err := in.ctl.Enqueue(context.Background(), flow.Request{FlowID: "t"})
					if err != nil {
						t.Errorf("%s: %v", in.name, err)
						return
					}
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					<-hold
					inFlight.Add(-1)
					tk.Release()
				}
				release := make(chan struct{})
				snapshot := map[string]string{}
				for range 2 {
					go run(a, release)
				}
				eventually(t, "a runs 2", func() bool { return inFlight.Load() == 2 })
				if loss == "older snapshot" {
					// A snapshot that has a's records but not b's.
					for _, key := range k.list() {
						if v, err := cl.Do(context.Background(), cl.B().Dump().Key(key).Build()).ToString(); err == nil {
							snapshot[key] = v
						}
					}
				}
				for range 2 {
					go run(b, release)
				}
				eventually(t, "the pool full: 4 in flight", func() bool { return inFlight.Load() == capacity })
				// a wants 2 more: they queue behind the full pool.
				for range 2 {
					go run(a, release)
				}
				eventually(t, "a queues 2", func() bool { return a.ctl.Snapshot().Queued == 2 })

				// Redis goes back in time: every record of the pool at once.
				if err := cl.Do(context.Background(), cl.B().Del().Key(k.list()...).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				for key, v := range snapshot {
					if err := cl.Do(context.Background(), cl.B().Restore().Key(key).Ttl(0).SerializedValue(v).Replace().Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
				// Over a renewal period and more, nothing runs beyond the
				// capacity: a's queued requests wait for b's, which still run.
				deadline := time.Now().Add(2500 * time.Millisecond)
				for time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if p := peak.Load(); p > capacity {
					t.Fatalf("%d requests in flight after Redis lost the pool's records; the pool holds %d", p, capacity)
				}
				if got := poolHeld(t, cl, k); got < capacity {
					t.Errorf("Redis records %d units held after the renewals; %d are in flight", got, inFlight.Load())
				}
				close(release)
				eventually(t, "every request served and the pool given back", func() bool {
					return inFlight.Load() == 0 && a.ctl.Snapshot().Queued == 0 && poolHeld(t, cl, k) == 0
				})
			})
		})
	}
}
