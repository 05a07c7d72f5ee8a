package qll

import "time"

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
// to take whichever replica frees first. Among free replicas the one with
// the fewest requests in flight wins. Between idle ones (the request will
// run alone) the lowest EWMA wins: on one-at-a-time replicas, the fastest
// free one. Between equal batches the one that got a request longest ago
// wins: a batch takes newcomers best one at a time (each prefill stalls
// the decodes of its step), as round robin spaces them.
//
// Latency does not rank batches because in-flight counts are exact and
// EWMAs are not: on identical batching engines a 30% swing of one
// replica's EWMA (a cold prefix, the phase of its step) sent it request
// after request while its slots were free (one engine of four took 3×
// another's share). A slower replica still gets less: its requests stay
// in flight longer, so its count is higher when the next request comes
// (Little's law). A replica never tried has no EWMA: it costs nothing
// while idle, so new capacity is used at once without drowning it.
//
// Busy replicas (explicit threshold only) are compared on the predicted
// latency of one more request, ewma × ceil((inFlight+1) / slots), ewma
// being one round's latency: weighting by load is what stops the
// reference's herding (it sent every request to the single lowest-EWMA
// replica while all were under the threshold).
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
			cost = r.ewma[kind]
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
		if best == nil || better(r, cost, free, best, bestCost, bestFree) {
			best, bestCost, bestFree = r, cost, free
		}
	}
	if best != nil {
		s.cursor++
	}
	return best
}

// better reports whether r (with cost and free) beats the best so far:
// free before busy; among free, fewer in flight, then (idle) the lower
// cost, then the one picked longest ago; among busy, the lower cost, then
// fewer in flight. Equal ones keep the first met, which the rotating
// start makes fair.
func better(r *replica, cost float64, free bool, best *replica, bestCost float64, bestFree bool) bool {
	switch {
	case free != bestFree:
		return free
	case !free:
		if cost != bestCost {
			return cost < bestCost
		}
		return r.inFlight < best.inFlight
	case r.inFlight != best.inFlight:
		return r.inFlight < best.inFlight
	case r.inFlight == 0 && cost != bestCost:
		return cost < bestCost
	}
	return r.lastPick < best.lastPick
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
