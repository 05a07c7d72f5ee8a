package redisleast

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// Instances whose backend sets differ.
//
// Every instance writes ITS backend set as the pool's member set in Redis
// (Sync), and Redis picks among its members only. While set-backends
// reaches the instances one after the other (or when they are configured
// with different static backends, or one's call failed), the set an
// instance has may share no replica with the one Redis holds, written by
// another instance: every pick of that instance finds no candidate a
// member. Refusing them (503) would leave it refusing every request while
// it has replicas of its own that are up — for seconds, or for good. And
// it must not write its set over the other's either (that is what the
// other's next Sync would do back: the member set would flip between the
// two, each flip moving the busy replicas to gone).
//
// So such a pick is served from this instance's own counts, as when Redis
// is unavailable (pickLocal): least loaded among its own leases, shedding
// at MaxInflight, the lease never recorded in Redis and released locally.
// The other instances do not see these requests, as they do not see this
// instance's picks during an outage; but the replicas are not members of
// the pool they share, so no instance picks them through Redis anyway.
// Counted (Stats.Mismatches) and logged, at most once a mismatchWarnEvery.
//
// Only when none of the candidates is a member: a set that shares some of
// them with Redis's is picked among those through Redis, as before.

// mismatchWarnEvery bounds the warnings about differing sets, per store.
const mismatchWarnEvery = time.Minute

// mismatchPick serves a pick none of whose candidates (from replicas,
// this instance's list, unchanged since the pick read it) is a member in
// Redis: from this instance's own counts (see above).
func (s *Store) mismatchPick(ctx context.Context, req *lb.Request, replicas []string) (*Lease, error) {
	if s.closed.Load() {
		return nil, lb.ErrShutdown
	}
	cands, err := candidatesOf(req, replicas)
	if err != nil {
		return nil, err
	}
	return s.pickUsable(cands, func(cands []string) (*Lease, error) {
		s.warnMismatch(ctx, cands)
		return s.pickLocal(cands, &s.c.mismatches)
	})
}

// SetLogger sets where the store logs (nil: slog.Default()): at present
// only the warning that this instance's backend set and the pool's in
// Redis share no replica (see mismatchPick).
func (s *Store) SetLogger(l *slog.Logger) { s.log.Store(l) }

func (m *member) logger() *slog.Logger {
	if l := m.log.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// warnMismatch logs, at most once a mismatchWarnEvery, that none of
// cands is a member of the pool in Redis.
func (m *member) warnMismatch(ctx context.Context, cands []string) {
	now := time.Now().UnixNano()
	last := m.mismatchWarned.Load()
	if last != 0 && now-last < int64(mismatchWarnEvery) || !m.mismatchWarned.CompareAndSwap(last, now) {
		return
	}
	// Redis's members as they are now (what the store last read may
	// predate the other instance's Sync): one call a mismatchWarnEvery at
	// most, which also refreshes Stats.InFlight.
	var redis []string
	if counts, err := m.counts(ctx); err == nil {
		for a := range counts {
			redis = append(redis, a)
		}
		slices.Sort(redis)
	}
	m.logger().Warn("global_redis_least: none of this instance's replicas is a member of the pool in Redis: "+
		"another instance synced a different backend set (set-backends not posted to every instance yet, "+
		"or instances configured with different backends); serving from this instance's own counts",
		slog.String("pool", m.pool), slog.String("instance", m.ident.Load().id),
		slog.String("candidates", few(cands)), slog.String("redis_members", few(redis)),
		slog.Uint64("mismatch_picks", m.c.mismatches.Load()+1))
}

// few names up to three of addrs, and how many more there are.
func few(addrs []string) string {
	const n = 3
	if len(addrs) <= n {
		return strings.Join(addrs, ",")
	}
	return fmt.Sprintf("%s,… (%d more)", strings.Join(addrs[:n], ","), len(addrs)-n)
}

// mismatchLog is what the store keeps for warnMismatch.
type mismatchLog struct {
	log            atomic.Pointer[slog.Logger] // SetLogger's; nil: slog.Default()
	mismatchWarned atomic.Int64                // unix ns of the last warning (0: none yet)
}
