package redisleast

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
)

// A store runs one mode, chosen at New from the configuration (QueueTimeout
// > 0: the global queue) and fixed for its life — switching needs a new
// store (Configure refuses it) — so nothing asks at run time which mode is
// running:
//
//   - leastRequest (leastrequest.go, batch.go, viewpick.go): pick the least
//     loaded replica, exactly (one script per pick and release, shedding at
//     MaxInflight) or within a Redis call budget (batches, view picks);
//   - globalQueue (queue.go): no free slot, wait in one FIFO queue shared
//     by every instance of the pool.
//
// Both run on the member (member.go), which keeps the records every mode
// shares.
type mode interface {
	records
	// start runs the mode's goroutines (on the member's WaitGroup); an
	// error is configuration, and New closes the store.
	start(ctx context.Context) error
	// pick is Select with Redis usable: breaker closed, candidates
	// healthy and not empty. onWait (if not nil) is told when the request
	// waits in a queue.
	pick(ctx context.Context, candidates []string, onWait lb.Waiter) (*Lease, error)
	// stop ends what the mode keeps waiting (Close, before the member
	// waits for the goroutines).
	stop()
	// stats adds the mode's figures to the member's.
	stats(st *Stats)
}

// newMode builds the mode named by Config.modeName on m.
func newMode(name string, m *member) mode {
	if name == modeQueue {
		return newGlobalQueue(m)
	}
	return newLeastRequest(m)
}

// records is what the member needs from the mode running on it.
type records interface {
	// The mode's scripts for the records every mode keeps (the member
	// runs them through call): releases ("?id": a lost select), a dead
	// instance's reaping, the member set.
	execRelease(ctx context.Context, ident *identity, ids []string) rueidis.RedisResult
	execReap(ctx context.Context, id string) rueidis.RedisResult
	execSync(ctx context.Context, ident *identity, replicas []string) rueidis.RedisResult
	// release ends a lease recorded (or to be recorded) in Redis, the
	// store not closed, and drops it from own.held.
	release(l *Lease)
	// maintain is the mode's share of each maintenance round (and of the
	// probe's, once Redis answers again).
	maintain(ctx context.Context)
	// drain sends what the mode keeps for Redis, ignoring any budget:
	// before the breaker closes after an outage, and at Close.
	drain()
	// rotated: the member took a new identity.
	rotated()
	// quiesce runs fn once the mode has sent everything it keeps for
	// Redis, and keeps it from picking or releasing meanwhile (the batcher;
	// reconcile holds own.mu for the rest); it skips fn if Redis did not
	// take what was kept.
	quiesce(fn func())
	// execReconcile runs the mode's reconcile script for ident from held,
	// its leases as (request id, replica) pairs (reconcile.go).
	execReconcile(ctx context.Context, ident *identity, floor int64, held []string) rueidis.RedisResult
}
