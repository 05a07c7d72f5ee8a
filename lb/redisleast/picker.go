package redisleast

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// The store as the global least-request policy's lb.Picker.

// syncTimeout bounds SetReplicas' round trip to Redis.
const syncTimeout = 2 * time.Second

// SetReplicas implements lb.Picker: Sync, bounded by 2s. It returns
// nothing: a set Redis could not take (away, breaker open, an error
// reply) is kept and applied as soon as Redis answers, whatever Redis
// still holds; SyncErr says whether that is still to happen.
func (s *Store) SetReplicas(addrs []string) {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	_ = s.Sync(ctx, addrs)
}

// SyncErr is why the last backend set (SetReplicas or Sync) is not in
// Redis yet; nil once it is (also when it got there later, by the replay
// after an outage).
func (s *Store) SyncErr() error {
	if p := s.set.syncErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Pick implements lb.Picker: Select over the replicas of the last
// SetReplicas (or Sync) less req.Unavailable and req.Avoid. None at all:
// lb.ErrNoBackends; none left after those: lb.ErrAllDown; a closed
// store: lb.ErrShutdown. req.Reason: global_least, view_pick, queued or
// local_fallback.
//
// A pick none of whose candidates is a member in Redis while this
// instance's list stands (another instance synced a set sharing no
// replica with this one's) is served from this instance's own counts,
// not refused: see mismatchPick. So is a queued request whose candidates
// all left the pool while it waited (the queue refuses it: it only ever
// hands a waiter one of its candidates): it picks again, like a new one.
func (s *Store) Pick(ctx context.Context, req *lb.Request) (lb.Lease, error) {
	if s.closed.Load() {
		return nil, lb.ErrShutdown
	}
	for changes := 0; ; changes++ {
		replicas, gen := s.set.current()
		l, err := s.pickAmong(ctx, req, replicas)
		if errors.Is(err, errNoMemberLeft) && changes < maxSetChanges {
			// Queued, then refused: none of its candidates is left in
			// the pool (a set-backends reached Redis meanwhile). No lease
			// was made; pick again, as a new request would.
			continue
		}
		if errors.Is(err, ErrNoCandidates) { // Redis picked nothing, no lease made
			if s.set.changedSince(gen) {
				// A set-backends that reached Redis between reading the
				// list and the select script left none of these candidates
				// a member: pick again from the set now in force (see
				// syncSet), bounded for sets posted back to back.
				if changes < maxSetChanges {
					continue
				}
			} else {
				// The list stands, so this instance's own Sync did not take
				// them out: another instance synced a different set (see
				// mismatchPick).
				l, err = s.mismatchPick(ctx, req, replicas)
			}
		}
		if err != nil {
			return nil, err
		}
		req.Reason = l.reason()
		return l, nil
	}
}

// pickAmong is one pick among replicas, the set read once.
func (s *Store) pickAmong(ctx context.Context, req *lb.Request, replicas []string) (*Lease, error) {
	cands, err := candidatesOf(req, replicas)
	if err != nil {
		return nil, err
	}
	return s.selectWaiting(ctx, cands, req.Waiter)
}

// candidatesOf is replicas less those req excludes.
func candidatesOf(req *lb.Request, replicas []string) ([]string, error) {
	if len(replicas) == 0 {
		return nil, lb.ErrNoBackends
	}
	cands := replicas
	if len(req.Unavailable)+len(req.Avoid) > 0 {
		cands = make([]string, 0, len(replicas))
		for _, r := range replicas {
			if !req.Excluded(r) {
				cands = append(cands, r)
			}
		}
		if len(cands) == 0 {
			return nil, lb.ErrAllDown
		}
	}
	return cands, nil
}

// maxSetChanges bounds the picks of one request that a set-backends
// overtook (see Pick), and its picks again after the queue refused it.
const maxSetChanges = 64

// reason is why the lease's replica was picked (lb.Request.Reason).
func (l *Lease) reason() string {
	switch {
	case l.Fallback:
		return lb.ReasonLocalFallback
	case l.why != "":
		return l.why
	}
	return lb.ReasonGlobalLeast
}

// InFlight implements lb.Picker: this instance's own leases not yet
// released, per replica (Redis and fallback leases alike). It never
// touches Redis; the pool-wide counts are in Counts and Stats.InFlight.
func (s *Store) InFlight() map[string]int {
	return s.local.snapshot()
}

// RetryAfter implements lb.RetryAfterer: how long a refused client
// (saturated, queue timeout) should wait — the mean time this instance's
// successful leases were held (one request's service, when a slot
// usually frees), at least one second.
func (s *Store) RetryAfter() time.Duration {
	return max(time.Second, s.svc.get())
}

// Replica implements lb.Lease.
func (l *Lease) Replica() string { return l.Addr }

var (
	_ lb.Picker       = (*Store)(nil)
	_ lb.RetryAfterer = (*Store)(nil)
	_ lb.Lease        = (*Lease)(nil)
)
