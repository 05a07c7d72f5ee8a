package qll

import (
	"context"
	"slices"

	"github.com/sluice-router/sluice/lb"
)

// State is the queued-least-latency policy's lb.Picker.

// SetReplicas implements lb.Picker (see SetBackends).
func (s *State) SetReplicas(addrs []string) { s.SetBackends(addrs) }

// Pick implements lb.Picker: Acquire, with req.Unavailable (the proxy's
// own health view, carried by every request) excluded from dispatch, for
// this request and for those already waiting: the latest request's view
// replaces the previous one. When every present replica is unavailable the
// request fails at once with lb.ErrAllDown rather than waiting for a
// health check to change its mind, and so do the requests waiting in the
// queue. Replicas down after failures (passive health) are different:
// requests wait for them, since their down time ends on its own.
func (s *State) Pick(ctx context.Context, req *lb.Request) (lb.Lease, error) {
	var unavailable []string
	if req != nil {
		unavailable = req.Unavailable
	}
	l, err := s.acquire(ctx, unavailable)
	if err != nil {
		return nil, err
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
// from the proxy's list and reports whether none is left to use. A
// replica that became available again gets the waiting requests; when
// none is left, the waiting requests fail with lb.ErrAllDown as the new
// one does (nothing would wake them otherwise: only a later request's
// view clears the flags).
func (s *State) markUnavailableLocked(unavailable []string) (noneLeft bool) {
	if len(unavailable) == 0 && !s.anyUnavailable {
		return false
	}
	s.anyUnavailable = false
	usable, freed := 0, false
	for _, r := range s.order {
		was := r.unavailable
		r.unavailable = slices.Contains(unavailable, r.addr)
		s.anyUnavailable = s.anyUnavailable || r.unavailable
		freed = freed || (was && !r.unavailable)
		if !r.unavailable {
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

// allUnavailableLocked reports whether every present replica is flagged
// unavailable (false for an empty set).
func (s *State) allUnavailableLocked() bool {
	for _, r := range s.order {
		if !r.unavailable {
			return false
		}
	}
	return len(s.order) > 0
}

var (
	_ lb.Picker       = (*State)(nil)
	_ lb.RetryAfterer = (*State)(nil)
	_ lb.Lease        = (*Lease)(nil)
	_ lb.FirstByter   = (*Lease)(nil)
)
