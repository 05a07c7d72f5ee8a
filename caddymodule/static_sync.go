package caddymodule

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
)

// staticSync feeds a policy state from reverse_proxy's own (static)
// upstream list when its pool has no managed backend set: it remembers the
// last list and calls apply only when the list changes, so the common
// case costs one comparison per request.
type staticSync struct {
	mu sync.Mutex
	// last is read without mu on every request (an unchanged list, the
	// common case, takes no lock) and written under mu after apply, so a
	// request that sees a new list also sees it applied.
	last atomic.Pointer[appliedStatic]
}

// appliedStatic is the static list last applied, as the backend set it
// became, and the scheme its URLs were made with.
type appliedStatic struct {
	set    []lb.Backend
	scheme upstreamScheme
}

func (s *staticSync) sync(pool reverseproxy.UpstreamPool, scheme upstreamScheme, apply func([]lb.Backend)) {
	if s.same(pool, scheme) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.same(pool, scheme) {
		return
	}
	last := &appliedStatic{set: staticBackends(pool, scheme), scheme: scheme}
	apply(slices.Clone(last.set))
	s.last.Store(last)
}

// same reports whether pool lists the dials last applied, reached with
// the same scheme (false before the first).
func (s *staticSync) same(pool reverseproxy.UpstreamPool, scheme upstreamScheme) bool {
	last := s.last.Load()
	if last == nil {
		return false
	}
	if len(pool) != len(last.set) || scheme != last.scheme {
		return false
	}
	for i := range pool {
		if pool[i].Dial != last.set[i].Dial {
			return false
		}
	}
	return true
}

// staticBackends is reverse_proxy's static upstream list as a backend set:
// what the Sluice policies pick from, and what flow_control counts, when
// the pool has no managed set. Each URL has the scheme the proxy's
// transport reaches the upstream with (engine metrics are read there).
func staticBackends(pool reverseproxy.UpstreamPool, scheme upstreamScheme) []lb.Backend {
	set := make([]lb.Backend, len(pool))
	for i, u := range pool {
		set[i] = lb.Backend{URL: scheme.url(u.Dial), Dial: u.Dial}
	}
	return set
}
