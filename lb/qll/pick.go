package qll

import (
	"math"
	"slices"
	"time"
)

// pickLocked returns the eligible replica to dispatch to, or nil when
// every replica should be left alone for now.
//
// A replica has slots: the requests it serves at once before it counts
// as busy, learned per replica (concurrencyLimit) unless Parallelism pins
// them. Eligible: present, not down (a replica whose down time has passed
// gets one probe at a time), under MaxConcurrency, and with a free slot —
// or, only under an explicit LatencyThreshold (the Hugging Face rule),
// busy but predicted at or under it.
//
// A replica with a free slot always beats a busy one: EWMAs are noisy,
// and a request that joins a busy replica's own queue has lost the chance
// to take whichever replica frees first. Among free replicas only those
// loaded about as little as the least loaded one compete (evenLoad).
// Between idle ones (the request will run alone) the lowest EWMA wins: on
// one-at-a-time replicas, the fastest free one. Between batches the lower
// EWMA wins only where the two differ beyond their noise and beyond the
// swing of identical engines (a slower replica, see slowerRatio);
// otherwise the one that got a request longest ago: a batch takes
// newcomers best one at a time (each prefill stalls the decodes of its
// step), as round robin spaces them.
//
// Ranking batches by the EWMA alone herded: on identical engines a 30%
// swing of one replica's EWMA (a cold prefix, the phase of its step) sent
// it request after request while its slots were free (one engine of four
// took 3× another's share). A replica never tried has no EWMA: it costs
// nothing while idle, so new capacity is used at once without drowning
// it.
//
// Busy replicas (explicit threshold only) are compared on the predicted
// latency of one more request, ewma × ceil((inFlight+1) / slots), ewma
// being one round's latency: weighting by load is what stops the
// reference's herding (it sent every request to the single lowest-EWMA
// replica while all were under the threshold).
//
// avoid lists the replicas that already failed this request (a retry):
// they are left out, and the load they are compared on is that of the
// rest.
func (s *State) pickLocked(now time.Time, avoid []string) *replica {
	n := len(s.order)
	if n == 0 {
		return nil
	}
	kind := s.costKindLocked()
	prior, priorN := 0.0, 0
	for _, r := range s.order {
		if r.tried[kind] {
			prior += r.ewma[kind]
			priorN++
		}
	}
	if priorN > 0 {
		prior /= float64(priorN)
	}
	threshold := s.cfg.LatencyThreshold.Seconds()

	// The least loaded free replica's count, and what counts as equal
	// to it (see evenLoad).
	least := -1
	for _, r := range s.order {
		if s.takesLocked(r, now, avoid) && r.inFlight < s.slotsLocked(r, now) && (least < 0 || r.inFlight < least) {
			least = r.inFlight
		}
	}
	even := evenLoad(least)
	// Among those, the same for the requests still waiting for their
	// first byte (in flight, not answering): a streaming engine's queue
	// of prefills. Two engines with as many requests in flight differ
	// when one has answered all of them and the other none (it stalls:
	// near its KV bound it admits no one for a second); the second is
	// left out until it catches up. For plain responses, whose first
	// byte comes with the whole answer, it is the in-flight count again.
	leastWaiting := -1
	for _, r := range s.order {
		w := r.inFlight - r.answering
		if s.takesLocked(r, now, avoid) && r.inFlight < s.slotsLocked(r, now) && r.inFlight <= even && (leastWaiting < 0 || w < leastWaiting) {
			leastWaiting = w
		}
	}
	evenWaiting := evenLoad(leastWaiting)

	var best candidate
	start := s.cursor % n
	for i := 0; i < n; i++ {
		r := s.order[(start+i)%n]
		if !s.takesLocked(r, now, avoid) {
			continue
		}
		par := s.slotsLocked(r, now)
		free := r.inFlight < par
		if !free && threshold == 0 {
			continue // adaptive: busy replicas wait for a free slot
		}
		if free && (r.inFlight > even || r.inFlight-r.answering > evenWaiting) {
			continue // a free replica as loaded as the least one takes it
		}
		cost, noise := 0.0, math.Inf(1)
		switch {
		case r.tried[kind] && free:
			cost = r.ewma[kind]
			// The EWMA's own standard error: the spread of its samples
			// times √(α/(2−α)).
			noise = math.Sqrt(r.spread[kind] * s.cfg.EWMAAlpha / (2 - s.cfg.EWMAAlpha))
		case r.tried[kind]:
			cost = r.ewma[kind] * float64((r.inFlight+par)/par)
		default:
			if priorN == 0 && !free {
				continue // nothing measured yet anywhere: one batch at a time
			}
			cost = prior * float64((r.inFlight+par-1)/par)
		}
		if !free && cost > threshold {
			continue
		}
		c := candidate{r, cost, noise, free}
		if best.r == nil || c.better(best) {
			best = c
		}
	}
	if best.r != nil {
		s.cursor++
	}
	return best.r
}

// usableLocked reports whether r may take a request now, whatever its
// load: present and not excluded by the proxy, under MaxConcurrency, and
// not down (a replica whose down time has passed gets one probe at a
// time).
func (s *State) usableLocked(r *replica, now time.Time) bool {
	if r.excluded() || (s.cfg.MaxConcurrency > 0 && r.inFlight >= s.cfg.MaxConcurrency) {
		return false
	}
	return r.downUntil.IsZero() || (!now.Before(r.downUntil) && r.inFlight == 0)
}

// takesLocked reports whether r may take this request now: usable, and
// not one this request already failed on.
func (s *State) takesLocked(r *replica, now time.Time, avoid []string) bool {
	return s.usableLocked(r, now) && !slices.Contains(avoid, r.addr)
}

// noneLeftLocked reports whether every replica present is either down
// in the proxy's view (not merely full) or in avoid: a retry that
// avoids them all has nowhere to wait for.
func (s *State) noneLeftLocked(avoid []string) bool {
	for _, r := range s.order {
		if (!r.unavailable || r.full) && !slices.Contains(avoid, r.addr) {
			return false
		}
	}
	return true
}

// evenLoad is the most requests in flight on a free replica that still
// count as loaded like the least loaded one, with `least` in flight:
// least + 1 (least itself when it is 0). Within it requests go round
// (the one picked longest ago); beyond it a replica is slower or stuck,
// and waits for the others to catch up. Only the fewest in flight is the
// right test for idle replicas; for batches it clustered arrivals: an
// engine ends the requests it admitted in one step in one step, the
// fewest in flight then took as many new ones in a row, which ended
// together again, and so on. A wider band, least + √least (the spread
// of a count of random arrivals), let identical engines drift 4 apart
// at 16 in flight: near their KV bound the more loaded ones evicted
// prefixes (calibrated engine, R = 4: TTFT p99 0.61 s against 0.59 s
// with one, round robin 0.57 s).
func evenLoad(least int) int {
	if least < 0 {
		return -1
	}
	return least + min(1, least)
}

// candidate is an eligible replica with the predicted latency it is
// ranked by (free: its EWMA; busy: see pickLocked) and that EWMA's
// standard error (+Inf when it has none).
type candidate struct {
	r           *replica
	cost, noise float64
	free        bool
}

// better reports whether c beats b: free before busy. Among free ones
// (all loaded evenly, see evenLoad): idle ones by the lower cost; the
// rest by the lower cost only where the two EWMAs differ by more than
// twice their combined standard error and by more than slowerRatio (a
// slower replica, not noise), else the one picked longest ago. Among busy ones: the lower cost, then
// fewer in flight. Equal ones keep the first met, which the rotating
// start makes fair.
func (c candidate) better(b candidate) bool {
	switch {
	case c.free != b.free:
		return c.free
	case !c.free:
		if c.cost != b.cost {
			return c.cost < b.cost
		}
		return c.r.inFlight < b.r.inFlight
	case c.r.inFlight == 0 && b.r.inFlight == 0 && c.cost != b.cost:
		return c.cost < b.cost
	case math.Abs(c.cost-b.cost) > 2*math.Hypot(c.noise, b.noise) && max(c.cost, b.cost) > slowerRatio*min(c.cost, b.cost):
		return c.cost < b.cost
	}
	return c.r.lastPick < b.r.lastPick
}

// slowerRatio: between batches loaded alike, an EWMA this many times
// another's is a slower replica; closer ones take turns. Identical
// engines' EWMAs swing 30% and more (a step's phase, a cold prefix,
// several prefills in one step), in runs of samples that agree — so
// their own noise estimate is small and cannot tell. Ranked on any
// difference beyond that noise, the calibrated engine's four replicas
// took two or three requests in a row whenever one's EWMA dipped, and
// their in-flight counts drifted √least apart (the TTFT tail above
// round robin's); a replica of half the speed (2×) is still told apart.
const slowerRatio = 1.5

// slotsLocked is how many requests r takes at now before the rest wait
// at the edge: pinned by Parallelism; 1 under an explicit
// LatencyThreshold (the reference router's model, whose threshold users
// tuned for it); else what its engine's own metrics say where it exports
// them (engine.go), the learned limit where it does not.
func (s *State) slotsLocked(r *replica, now time.Time) int {
	n, _ := s.slotsFromLocked(r, now)
	return n
}

// slotsFromLocked is slotsLocked and where the slots come from.
func (s *State) slotsFromLocked(r *replica, now time.Time) (int, string) {
	switch {
	case s.cfg.Parallelism > 0:
		return s.cfg.Parallelism, slotsPinned
	case s.cfg.LatencyThreshold > 0:
		return 1, slotsPinned
	}
	return r.eng.slotsAt(now, max(1, r.lim.slots()))
}

// costKindLocked is the latency kind predictions compare: plain (time to
// last byte) once any replica has such a sample, else streamed (first
// byte). Replicas are only compared on one kind: a replica that served
// only streams must not look 5× faster than one that served completions.
func (s *State) costKindLocked() int {
	for _, r := range s.order {
		if r.tried[plainKind] {
			return plainKind
		}
	}
	return streamKind
}
