package caddymodule

import (
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// A shared state no config uses any more (the config that used it was
// replaced by one that changed a connection setting, or that no longer
// uses the module on that pool) may still hold requests: Caddy stops the
// old config's servers without waiting for the requests they serve, and
// cleans the old modules up at once. Destroyed then, the state answered
// its queued requests 500 and, backed by Redis, gave up the records of
// requests still running (the next pick saw their replica free: a
// max_inflight 1 replica got two). So a state is destroyed only once the
// requests it holds have ended — each ends on its own: served, timed out
// in the queue, or cut by Caddy's grace_period — or after drainLimit, a
// bound against a request that never ends. Until then it keeps following
// its pool's backend set and running its loops; it is no longer in the
// registry (health and metrics show the live states only), and a new
// config builds a new state beside it.

// drainLimit bounds how long a replaced state waits for its requests.
const drainLimit = 10 * time.Minute

// drainPoll is how often a draining state looks whether its requests
// have ended (a policy's in-flight count has no signal of its own).
const drainPoll = 20 * time.Millisecond

// requestGauge counts the requests inside a state's adapter now: a
// policy's Selects (queued ones included), a flow_control handler's
// requests.
type requestGauge struct{ n atomic.Int64 }

func (g *requestGauge) enter()     { g.n.Add(1) }
func (g *requestGauge) leave()     { g.n.Add(-1) }
func (g *requestGauge) idle() bool { return g.n.Load() == 0 }

// destroyWhenIdle runs destroy now if idle, else once idle or after
// drainLimit, in a goroutine of its own.
func destroyWhenIdle(what stateKey, idle func() bool, destroy func()) {
	if idle() {
		destroy()
		return
	}
	log := caddy.Log().Named("sluice")
	log.Info("a replaced state keeps serving its requests until they end", zap.String("module", what.module),
		zap.String("pool", what.pool), zap.Duration("at_most", drainLimit))
	go func() {
		deadline := time.Now().Add(drainLimit)
		tick := time.NewTicker(drainPoll)
		defer tick.Stop()
		for !idle() {
			if time.Now().After(deadline) {
				log.Warn("a replaced state still held requests after the drain limit; they are answered 503 shutdown",
					zap.String("module", what.module), zap.String("pool", what.pool))
				break
			}
			<-tick.C
		}
		destroy()
	}()
}

// totalInFlight sums a picker's in-flight counts.
func totalInFlight(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
