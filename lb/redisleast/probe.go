package redisleast

import (
	"slices"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// Passive health's probe: a replica that failures marked down takes one
// request at a time once its down time is over (tracker.AcquireUsable).
// Which replica a request gets is decided in Redis (or from the view, or
// by the queue's hand-over) after the health check, so a check alone lets
// every pick that read the replica up before the first was counted probe
// it. So the health lease is taken once the pick is made; refused (the
// probe went to another request meanwhile, or the replica is down again),
// the pick is undone — its lease released, once, as any other — and made
// again without that replica.

// pickUsable runs pick among candidates (less those passive health has
// down) until health takes the lease it makes, each replica refused left
// out of the next try: at most one try per candidate.
func (m *member) pickUsable(candidates []string, pick func([]string) (*Lease, error)) (*Lease, error) {
	for range len(candidates) {
		if candidates = m.healthy(candidates); len(candidates) == 0 {
			return nil, lb.ErrAllDown
		}
		l, err := pick(candidates)
		if err != nil || m.admit(l) {
			return l, err
		}
		candidates = slices.DeleteFunc(slices.Clone(candidates), func(a string) bool { return a == l.Addr })
	}
	return nil, lb.ErrAllDown
}

// admit takes l's passive-health lease; false when health refuses it, l
// then released (its counts, Redis's included, undone). A replica the
// tracker does not know (not in the set) has no health to keep: its
// lease goes without. A lease admitted already (the queue admits what it
// hands over, see admitHanded) is not admitted again.
func (m *member) admit(l *Lease) bool {
	if l.hl != nil {
		return true
	}
	if l.hl = m.health.AcquireUsable(l.Addr, 0); l.hl != nil {
		return true
	}
	if _, known := m.health.View(l.Addr, time.Time{}); !known {
		return true
	}
	l.Release(lb.Outcome{Kind: lb.Cancelled})
	return false
}
