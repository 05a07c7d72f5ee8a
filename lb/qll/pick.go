package qll

import "time"

// pickLocked returns the eligible replica with the lowest predicted
// latency, or nil when every replica should be left alone for now.
//
// A replica has slots: the requests it serves at once without slowing
// down, learned per replica (concurrencyLimit) unless Parallelism pins
// them. Prediction: a replica with `inFlight` requests running will take
// about
//
//	ewma × ceil((inFlight+1) / slots)
//
// for one more, ewma being one round's latency. Weighting by load is what
// stops the reference's herding (it sent every request to the single
// lowest-EWMA replica while all were under the threshold). A replica never
// tried has no EWMA: it is predicted from the mean of the others but its
// first requests cost nothing, so new capacity is used at once without
// drowning it.
//
// A replica with a free slot always beats a busy one: EWMAs are noisy, and
// a request that joins a busy replica's own queue has lost the chance to
// take whichever replica frees first.
//
// Eligible: present, not down (a replica whose down time has passed gets
// one probe at a time), under MaxConcurrency, and with a free slot — or,
// only under an explicit LatencyThreshold (the Hugging Face rule), busy
// but predicted at or under it.
func (s *State) pickLocked(now time.Time) *replica {
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

	var best *replica
	bestCost, bestFree := 0.0, false
	start := s.cursor % n
	for i := 0; i < n; i++ {
		r := s.order[(start+i)%n]
		if r.excluded() || (s.cfg.MaxConcurrency > 0 && r.inFlight >= s.cfg.MaxConcurrency) {
			continue
		}
		if !r.downUntil.IsZero() {
			if now.Before(r.downUntil) {
				continue
			}
			if r.inFlight > 0 {
				continue // half-open: one probe at a time
			}
		}
		par := s.slotsLocked(r)
		free := r.inFlight < par
		if !free && threshold == 0 {
			continue // adaptive: busy replicas wait for a free slot
		}
		var cost float64
		switch {
		case r.tried[kind] && free:
			// Free slots are not all equal: a batch slows as it fills, so
			// among free replicas the cost grows with the share of the
			// slots in use (one-at-a-time replicas: the EWMA alone).
			// Without it every free request went to the lowest EWMA, and
			// one engine of four took 3× another's share.
			cost = r.ewma[kind] * float64(par+r.inFlight) / float64(par)
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
		if best == nil || (free && !bestFree) ||
			(free == bestFree && (cost < bestCost || (cost == bestCost && r.inFlight < best.inFlight))) {
			best, bestCost, bestFree = r, cost, free
		}
	}
	if best != nil {
		s.cursor++
	}
	return best
}

// slotsLocked is how many requests r serves at once without slowing down:
// pinned by Parallelism; 1 under an explicit LatencyThreshold (the
// reference router's model, whose threshold users tuned for it); else
// learned.
func (s *State) slotsLocked(r *replica) int {
	switch {
	case s.cfg.Parallelism > 0:
		return s.cfg.Parallelism
	case s.cfg.LatencyThreshold > 0:
		return 1
	}
	return max(1, r.lim.slots())
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
