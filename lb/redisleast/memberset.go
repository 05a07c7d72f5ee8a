package redisleast

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// memberSet is the pool's member set as this instance gives it: the
// last Sync (replayed when Redis comes back empty, or with older data),
// whether Redis has it yet, and the global counts last read.
type memberSet struct {
	mu     sync.Mutex
	last   []string
	gen    uint64 // bumped by every setMembers (see Store.Pick)
	counts map[string]int64

	syncMu   sync.Mutex            // serializes sync, resync and replay
	unsynced atomic.Bool           // the last set has not reached Redis
	syncErr  atomic.Pointer[error] // why the last set is not in Redis yet (nil: it is)
}

func (r *memberSet) setMembers(m []string) {
	r.mu.Lock()
	r.last = m
	r.gen++
	r.mu.Unlock()
}

func (r *memberSet) members() []string {
	m, _ := r.current()
	return m
}

// current is the members and their generation, read together.
func (r *memberSet) current() ([]string, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.gen
}

// changedSince reports whether a set was given after generation gen.
func (r *memberSet) changedSince(gen uint64) bool {
	_, g := r.current()
	return g != gen
}

func (r *memberSet) setCounts(c map[string]int64) {
	r.mu.Lock()
	r.counts = c
	r.mu.Unlock()
}

func (r *memberSet) lastCounts() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts
}

// syncSet is Store.Sync.
func (m *member) syncSet(ctx context.Context, replicas []string) error {
	m.set.syncMu.Lock()
	defer m.set.syncMu.Unlock()
	replicas = slices.Clone(replicas)
	// Picks take their candidates from the list, and Redis picks among
	// its own members: the list changes only after Redis has the set (or
	// could not take it), never before, so that a pick whose candidates
	// Redis no longer has finds the list changed once this call is over
	// (its resync waits for syncMu) and picks again from it (Store.Pick).
	defer m.set.setMembers(replicas)
	m.local.retain(replicas)
	m.health.SetReplicas(replicas)
	if m.br.isOpen() {
		err := fmt.Errorf("redis %v: circuit breaker open; will sync when it closes", m.conf().Addrs)
		m.set.unsynced.Store(true)
		m.set.syncErr.Store(&err)
		return err
	}
	return m.sync(ctx, replicas)
}

func (m *member) sync(ctx context.Context, replicas []string) error {
	ident := m.ident.Load()
	floor := ident.acked.Load()
	v, err := m.call(ctx, func(ctx context.Context) rueidis.RedisResult { return m.rec.execSync(ctx, ident, replicas) }).AsInt64()
	if err != nil {
		err = fmt.Errorf("redis sync: %w", err)
		m.set.unsynced.Store(true)
		m.set.syncErr.Store(&err)
		return err
	}
	m.noteVersion(ident, floor, v)
	m.set.unsynced.Store(false)
	m.set.syncErr.Store(nil)
	_, err = m.counts(ctx)
	return err
}

// resync replays the last Sync when Redis holds no member (it restarted
// without persistence, or the key was deleted). True if it synced.
func (m *member) resync(ctx context.Context) bool {
	m.set.syncMu.Lock()
	defer m.set.syncMu.Unlock()
	last := m.set.members()
	if !m.set.unsynced.Load() {
		if len(last) == 0 {
			return false
		}
		res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
			return m.rc().Do(ctx, m.rc().B().Zcard().Key(m.k.load).Build())
		})
		if n, err := res.AsInt64(); err != nil || n > 0 {
			return false
		}
	}
	return m.sync(ctx, last) == nil
}

// counts is Store.Counts.
func (m *member) counts(ctx context.Context) (map[string]int64, error) {
	res := m.call(ctx, func(ctx context.Context) rueidis.RedisResult {
		return m.rc().Do(ctx, m.rc().B().Zrange().Key(m.k.load).Min("0").Max("-1").Withscores().Build())
	})
	zs, err := res.AsZScores()
	if err != nil {
		return nil, fmt.Errorf("redis counts: %w", err)
	}
	out := make(map[string]int64, len(zs))
	for _, z := range zs {
		out[z.Member] = countOf(z.Score)
	}
	m.set.setCounts(out)
	return out, nil
}

// replaySet writes the last Sync again: the member set may have gone back
// with the rest.
func (m *member) replaySet(ctx context.Context) {
	m.set.syncMu.Lock()
	defer m.set.syncMu.Unlock()
	if last := m.set.members(); len(last) > 0 {
		_ = m.sync(ctx, last)
	}
}

// maxCount bounds the counts read from Redis's scores: float64 counts
// whole numbers exactly up to 2^53.
const maxCount = 1 << 53

// countOf is a Redis score read as a count of requests. Scores are
// outside input: one past ±maxCount (±inf included) is clamped there, in
// the order it sorts (int64 of +inf is math.MinInt64 on amd64: the
// busiest replica read as the idlest), until the next script that reads
// it counts the replica again (recount.go).
func countOf(score float64) int64 {
	switch {
	case score >= maxCount, math.IsNaN(score): // NaN: no count, so not idle
		return maxCount
	case score <= -maxCount:
		return -maxCount
	}
	return int64(score)
}
