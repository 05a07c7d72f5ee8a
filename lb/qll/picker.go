package qll

import (
	"context"
	"slices"

	"github.com/sluice-router/sluice/lb"
)

// State is the queued-least-latency policy's lb.Picker.

// SetReplicas implements lb.Picker: SetBackends with each address reached
// at http://addr.
func (s *State) SetReplicas(addrs []string) { s.SetBackends(lb.PlainBackends(addrs)) }

// Pick implements lb.Picker: Acquire, with req.Unavailable (the proxy's
// own health view, carried by every request) excluded from dispatch, for
// this request and for those already waiting: the latest request's view
// replaces the previous one. When every present replica is unavailable the
// request fails at once with lb.ErrAllDown rather than waiting for a
// health check to change its mind, and so do the requests waiting in the
// queue. Replicas that are only full (req.Full: at the proxy's request
// limit) are busy, not down: requests wait for them, and each of our
// requests on one that ends frees a slot under the limit. Replicas down after failures
// (Sluice's passive health) also keep their waiters, since their down
// time ends on its own. req.Reason: queued if the lease came through the
// queue, else least_latency.
func (s *State) Pick(ctx context.Context, req *lb.Request) (lb.Lease, error) {
	var unavailable, full, avoid []string
	var waiter lb.Waiter
	if req != nil {
		unavailable, full, avoid, waiter = req.Unavailable, req.Full, req.Avoid, req.Waiter
	}
	l, err := s.acquire(ctx, unavailable, full, avoid, waiter)
	if err != nil {
		return nil, err
	}
	if req != nil {
		req.Reason = lb.ReasonLeastLatency
		if l.Waited > 0 {
			req.Reason = lb.ReasonQueued
		}
	}
	return l, nil
}

// InFlight implements lb.Picker: in-flight leases per replica, draining
// ones included.
func (s *State) InFlight() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.replicas))
	for a, r := range s.replicas {
		if r.inFlight > 0 {
			out[a] = r.inFlight
		}
	}
	return out
}

// Config is the configuration the state runs with now.
func (s *State) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// Replica implements lb.Lease.
func (l *Lease) Replica() string { return l.Addr }

// markUnavailableLocked refreshes each present replica's unavailable flag
// from the proxy's view and reports whether none is left to use, now or
// later. A replica that became available again gets the waiting
// requests; when every one is down (not merely full), the waiting
// requests fail with lb.ErrAllDown as the new one does (nothing would
// wake them otherwise: only a later request's view clears the flags of
// a down replica, while a full one frees a slot whenever one of our
// requests on it ends).
func (s *State) markUnavailableLocked(unavailable, full []string) (noneLeft bool) {
	if len(unavailable) == 0 && !s.anyUnavailable {
		return false
	}
	s.anyUnavailable = false
	usable, freed := 0, false
	for _, r := range s.order {
		was := r.unavailable
		r.unavailable = slices.Contains(unavailable, r.addr)
		r.full = r.unavailable && slices.Contains(full, r.addr)
		// At least one: the proxy counts a request until its handler
		// returns, a moment after our release, so "full" with none of ours
		// in flight is most likely that moment, and nothing of ours would
		// end to free a slot (the queue would stall until a new request).
		// The cost, when another route really holds the replica's count:
		// one request of ours over its limit.
		r.fullCap = max(r.inFlight, 1)
		s.anyUnavailable = s.anyUnavailable || r.unavailable
		freed = freed || (was && !r.unavailable)
		if !r.unavailable || r.full {
			usable++
		}
	}
	if usable == 0 {
		s.failAllLocked(lb.ErrAllDown)
		return true
	}
	if freed {
		s.dispatchLocked()
	}
	return false
}

// excluded reports whether the proxy's view keeps r from taking a request
// now: down, or full with none of our requests on it ended since the
// proxy said so.
func (r *replica) excluded() bool {
	return r.unavailable && !(r.full && r.inFlight < r.fullCap)
}

// allUnavailableLocked reports whether every present replica is flagged
// unavailable and not merely full (false for an empty set).
func (s *State) allUnavailableLocked() bool {
	for _, r := range s.order {
		if !r.unavailable || r.full {
			return false
		}
	}
	return len(s.order) > 0
}

var (
	_ lb.Picker       = (*State)(nil)
	_ lb.RetryAfterer = (*State)(nil)
	_ lb.ProxyViewer  = (*State)(nil)
	_ lb.Lease        = (*Lease)(nil)
	_ lb.FirstByter   = (*Lease)(nil)
)
