package redisleast

import (
	"context"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
)

// leastRequest is the mode without a queue: every pick goes to the least
// loaded candidate. With MaxInflight set (it sheds at it) or CallRate
// unlimited, each pick and each release is one script (exact); otherwise
// picks and releases go through the batcher, within CallRate calls a
// second (batch.go). Both settings are live, so a store switches between
// the two as it is configured; a batched lease is released through the
// batcher whatever the settings then.
type leastRequest struct {
	m     *member
	batch batcher
}

func newLeastRequest(m *member) *leastRequest {
	lr := &leastRequest{m: m}
	b := &lr.batch
	b.m = m
	b.resetLocked(m.ident.Load())
	b.cond.L = &b.mu
	b.kick = make(chan struct{}, 1)
	return lr
}

func (lr *leastRequest) start(context.Context) error {
	lr.m.wg.Add(1)
	go lr.batch.flusher()
	return nil
}

func (lr *leastRequest) pick(ctx context.Context, candidates []string, _ lb.Waiter) (*Lease, error) {
	if c := lr.m.cfgp.Load(); c.MaxInflight == 0 && c.CallRate > 0 {
		return lr.batch.pick(ctx, c, candidates, false)
	}
	return lr.exact(ctx, candidates)
}

// exact picks with one select script (shedding at MaxInflight).
func (lr *leastRequest) exact(ctx context.Context, candidates []string) (*Lease, error) {
	m := lr.m
	m.own.mu.RLock()
	defer m.own.mu.RUnlock()
	p, err := m.scriptPick(ctx, candidates, func(deadline time.Time, ident *identity, _ string, args []string) rueidis.RedisResult {
		args = append(args, candidates...)
		return m.callUntil(ctx, deadline, func(ctx context.Context) rueidis.RedisResult {
			return selectScript.Exec(ctx, m.rc(), []string{m.k.load, ident.alive, ident.inst, m.k.insts}, args)
		})
	})
	if err != nil {
		return nil, err
	}
	return m.leaseFor(p, candidates)
}

func (lr *leastRequest) release(l *Lease) {
	if l.batched {
		lr.batch.release(l.ident, l.req, l.Addr, l)
		return
	}
	lr.m.releaseRecorded(l)
}

func (lr *leastRequest) execRelease(ctx context.Context, ident *identity, ids []string) rueidis.RedisResult {
	m := lr.m
	return releaseScript.Exec(ctx, m.rc(), []string{m.k.load, m.k.gone, ident.inst}, ids)
}

func (lr *leastRequest) execReap(ctx context.Context, id string) rueidis.RedisResult {
	m := lr.m
	return reapScript.Exec(ctx, m.rc(), []string{m.k.load, m.k.gone, m.k.alive(id), m.k.inst(id), m.k.insts}, []string{id})
}

func (lr *leastRequest) execSync(ctx context.Context, ident *identity, replicas []string) rueidis.RedisResult {
	m := lr.m
	return syncScript.Exec(ctx, m.rc(), []string{m.k.load, m.k.gone, ident.inst}, replicas)
}

// maintain: a batch that failed below the breaker's limit goes again.
func (lr *leastRequest) maintain(context.Context) { lr.batch.poke() }

func (lr *leastRequest) drain() { lr.batch.drain() }

func (lr *leastRequest) quiesce(fn func()) { lr.batch.quiesce(fn) }

func (lr *leastRequest) execReconcile(ctx context.Context, ident *identity, floor int64, held []string) rueidis.RedisResult {
	m := lr.m
	return reconcileScript.Exec(ctx, m.rc(), []string{m.k.load, m.k.gone, ident.alive, ident.inst, m.k.insts},
		append(m.reconcileArgs(ident, floor), held...))
}

func (lr *leastRequest) rotated() {} // the batcher drops the old identity's events at its next use

func (lr *leastRequest) stop() {}

func (lr *leastRequest) stats(st *Stats) {
	st.Pending += lr.batch.stuck(lr.m.ident.Load(), lr.m.br.isOpen())
}
