package tracker

import "github.com/sluice-router/sluice/lb"

// Replica implements lb.Lease.
func (l *Lease) Replica() string { return l.Addr }

// Config is the configuration the tracker runs with now.
func (t *Tracker) Config() Config {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.cfg
}

// PerReplica is the in-flight count per replica address (draining ones
// included, an address added back while its old requests drain counting
// both; idle ones left out), as lb.Picker's InFlight reports it.
func (t *Tracker) PerReplica() map[string]int {
	out := map[string]int{}
	for _, s := range t.Snapshot() {
		if s.InFlight > 0 {
			out[s.Addr] += s.InFlight
		}
	}
	return out
}

var _ lb.Lease = (*Lease)(nil)
