package qll

import "time"

// pickLocked returns the eligible replica with the lowest predicted
// latency, or nil when every replica should be left alone for now.
//
// Prediction: a replica serving `Parallelism` requests at once, with
// `inFlight` already running, will take about
//
//	ewma × ceil((inFlight+1) / Parallelism)
//
// for one more. Weighting by load is what stops the reference's herding
// (it sent every request to the single lowest-EWMA replica while all were
// under the threshold). A replica never tried has no EWMA: it is predicted
// from the mean of the others but its first requests cost nothing, so new
// capacity is used at once without drowning it.
//
// A replica with a free slot (fewer than Parallelism in flight) always
// beats a busy one: EWMAs are noisy (one slow sample moves them by half),
// and a request that joins a busy replica's own queue has lost the chance
// to take whichever replica frees first.
//
// Eligible: present, not down (a replica whose down time has passed gets
// one probe at a time), under MaxConcurrency, and either with a free slot
// (idle, for Parallelism 1) or predicted at or under LatencyThreshold. A
// free slot predicts one round, what an idle replica predicts: a replica
// serving 8 at once whose requests take longer than the threshold still
// takes 8, not 1. "A free slot is always eligible" is also what lets a
// slow EWMA recover: the replica keeps getting work.
func (s *State) pickLocked(now time.Time) *replica {
	n := len(s.order)
	if n == 0 {
		return nil
	}
	prior, priorN := 0.0, 0
	for _, r := range s.order {
		if r.tried {
			prior += r.ewma
			priorN++
		}
	}
	if priorN > 0 {
		prior /= float64(priorN)
	}
	threshold := s.cfg.LatencyThreshold.Seconds()
	par := s.cfg.Parallelism

	var best *replica
	bestCost, bestFree := 0.0, false
	start := s.cursor % n
	for i := 0; i < n; i++ {
		r := s.order[(start+i)%n]
		if r.unavailable || (s.cfg.MaxConcurrency > 0 && r.inFlight >= s.cfg.MaxConcurrency) {
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
		var cost float64
		if r.tried {
			cost = r.ewma * float64((r.inFlight+par)/par)
		} else {
			if priorN == 0 && r.inFlight >= par {
				continue // nothing measured yet anywhere: one batch at a time
			}
			cost = prior * float64((r.inFlight+par-1)/par)
		}
		free := r.inFlight < par
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
