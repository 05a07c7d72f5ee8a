package tracker

import (
	"math"
	"time"
)

// View is what a pick that ranks every replica reads of one, from one
// lookup (a read lock and a map access apiece for each fact cost a
// ranking policy a measurable share of its throughput on tiny requests).
type View struct {
	// InFlight and Usable are Load's.
	InFlight int
	Usable   bool
	// Active is the in-flight count and ActiveCost the sum of those
	// requests' costs, not counting requests started before the cutoff:
	// a request an engine dropped without answering must stop counting
	// at some point (Heimdall's active-request scorer timeout).
	Active     int
	ActiveCost int64
	// LastAcquired is the acquisition number of the replica's latest
	// request: the replica with the smallest got one longest ago (0:
	// never).
	LastAcquired uint64
	// Pace is the replica's recent time to last byte per unit of cost,
	// in seconds (an EWMA of its successful requests; 0 when it has none
	// yet). Between replicas that get the same mix of requests, a higher
	// pace is a slower (or more loaded) replica.
	Pace float64
}

// View returns addr's view at cutoff; false if addr is not a present
// replica.
func (t *Tracker) View(addr string, cutoff time.Time) (View, bool) {
	t.mu.RLock()
	r, ok := t.reps[addr]
	ok = ok && r.present.Load()
	t.mu.RUnlock()
	if !ok {
		return View{}, false
	}
	v := View{LastAcquired: r.lastAcquired.Load(), Pace: math.Float64frombits(r.pace.Load())}
	r.lmu.Lock()
	// A lease's cost leaves the sum under lmu, as it is unlinked, so the
	// walk below never subtracts a cost twice; leases are linked oldest
	// first, so the walk stops at the first one after the cutoff.
	n, cost := int(r.inFlight.Load()), r.inFlightCost.Load()
	v.InFlight = n
	for l := r.head; l != nil && l.start.Before(cutoff); l = l.next {
		n--
		cost -= l.cost
	}
	r.lmu.Unlock()
	v.Active, v.ActiveCost = max(n, 0), max(cost, 0)
	v.Usable = !t.downNow(r, v.InFlight)
	return v, true
}
