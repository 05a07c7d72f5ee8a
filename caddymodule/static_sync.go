package caddymodule

import (
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
)

// staticSync feeds a policy state from reverse_proxy's own (static)
// upstream list when its pool has no managed backend set: it remembers the
// last list and calls apply only when the list changes, so the common
// case costs one comparison per request.
type staticSync struct {
	mu   sync.Mutex
	last []string
}

func (s *staticSync) sync(pool reverseproxy.UpstreamPool, apply func([]lb.Backend)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	same := len(pool) == len(s.last)
	for i := 0; same && i < len(pool); i++ {
		same = pool[i].Dial == s.last[i]
	}
	if same {
		return
	}
	s.last = make([]string, len(pool))
	for i, u := range pool {
		s.last[i] = u.Dial
	}
	apply(staticBackends(pool))
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
