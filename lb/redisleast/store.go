// Package redisleast is the global least-request policy's shared state:
// per pool, a Redis sorted set of replica → in-flight count that every
// Sluice instance reads and updates with atomic scripts (Photoroom's
// distributed least-request), plus what makes it safe to depend on: load
// shedding, reclaiming the requests of crashed instances, and a circuit
// breaker with a local fallback while Redis is unavailable. Optionally
// (QueueTimeout) requests that find no free slot wait in one global FIFO
// queue shared by every instance instead of being shed (queue.go).
package redisleast

import (
	"context"
	"fmt"

	"github.com/sluice-router/sluice/lb"
)

// Errors Select returns instead of a lease.
var (
	// ErrSaturated: even the least-loaded candidate has MaxInflight
	// requests in flight; answer 503 with Retry-After.
	// It is lb.ErrSaturated.
	ErrSaturated = lb.ErrSaturated
	// ErrNoCandidates: no candidate given, or none is a member of the
	// pool (errors.Is lb.ErrNoBackends).
	ErrNoCandidates = fmt.Errorf("no candidate replica is a member of the pool: %w", lb.ErrNoBackends)
)

// Store is one pool's shared state as seen by one instance. Safe for
// concurrent use.
type Store struct {
	// A member (this instance's records in the pool's Redis, the same in
	// every mode: member.go) under one mode chosen at New (mode.go).
	*member
	mode mode
}

// New connects to Redis and starts the instance's background loop (lease
// renewal, reaping dead instances, flushing pending releases).
//
// Redis that cannot be reached (refused, timed out, unknown host) does not
// fail New: a proxy restarted during a Redis outage must still serve. The
// store then starts with the breaker open — every Select served by the
// local fallback — and the probe connects when Redis answers; Unreachable
// reports the cause so the caller can log it. A Redis that answers with an
// error (wrong password, a user lacking a command, key or channel the
// store uses: see permScript) fails New: that is configuration.
func New(ctx context.Context, cfg Config, pool string) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opt, err := cfg.clientOption()
	if err != nil {
		return nil, err
	}
	m := newMember(cfg, pool)
	s := &Store{member: m, mode: newMode(cfg.modeName(), m)}
	m.rec = s.mode
	if err := m.open(ctx, opt); err != nil {
		return nil, err
	}
	m.start()
	if err := s.mode.start(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// InstanceID is the name this instance currently records requests under.
func (s *Store) InstanceID() string { return s.ident.Load().id }

// Pool is the pool's name.
func (s *Store) Pool() string { return s.pool }

// Sync makes replicas the pool's member set in Redis: new replicas join at
// 0, removed ones leave, staying ones keep their counts. The list is also
// remembered and replayed if Redis comes back empty (restart).
//
// A set given while Redis cannot take it (breaker open, an error) is
// marked unsynced and applied as soon as Redis answers, whatever Redis
// still holds.
func (s *Store) Sync(ctx context.Context, replicas []string) error { return s.syncSet(ctx, replicas) }

// Counts reads the global in-flight count of every member replica.
func (s *Store) Counts(ctx context.Context) (map[string]int64, error) { return s.counts(ctx) }

// Stats snapshots the counters and state.
func (s *Store) Stats() Stats {
	st := s.member.stats()
	s.mode.stats(&st)
	return st
}

// Close stops the background loop, sends the releases still pending and
// deletes the liveness key, so whatever this instance still has recorded
// is reclaimed by the next reaper instead of after LeaseTTL. Leases
// released after Close only update the local counts.
func (s *Store) Close() {
	if !s.shut() {
		return
	}
	s.mode.stop() // waiting Selects leave the queue (or keep their slot)
	s.member.close()
}

// Unreachable is why Redis could not be used when the store started (nil
// if it could): the store then serves from the local fallback until the
// probe gets through.
func (s *Store) Unreachable() error { return s.unreachableErr() }
