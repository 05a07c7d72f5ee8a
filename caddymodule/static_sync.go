package caddymodule

import (
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
	last atomic.Pointer[[]string]
}

func (s *staticSync) sync(pool reverseproxy.UpstreamPool, apply func([]lb.Backend)) {
	if s.same(pool) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.same(pool) {
		return
	}
	last := make([]string, len(pool))
	for i, u := range pool {
		last[i] = u.Dial
	}
	apply(staticBackends(pool))
	s.last.Store(&last)
}

// same reports whether pool lists the dials last applied (none before the
// first).
func (s *staticSync) same(pool reverseproxy.UpstreamPool) bool {
	var last []string
	if p := s.last.Load(); p != nil {
		last = *p
	}
	if len(pool) != len(last) {
		return false
	}
	for i := range pool {
		if pool[i].Dial != last[i] {
			return false
		}
	}
	return true
}

// staticBackends is reverse_proxy's static upstream list as a backend set:
// what the Sluice policies pick from, and what flow_control counts, when
// the pool has no managed set.
func staticBackends(pool reverseproxy.UpstreamPool) []lb.Backend {
	set := make([]lb.Backend, len(pool))
	for i, u := range pool {
		set[i] = lb.Backend{URL: "http://" + u.Dial, Dial: u.Dial}
	}
	return set
}
