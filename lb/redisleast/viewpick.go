package redisleast

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// A pick from the view (beyond call_rate) cannot see what the other
// instances picked since the view was read. Picking the view's least
// loaded replica regardless, every instance would send its requests to the
// same few replicas until the next reply (herding): on one-at-a-time
// replicas the one idle replica everybody sees gets them all.
//
// So the batcher estimates the other instances' pick rate from the pool's
// pick counter (every batch adds its picks to it; the reply carries it)
// and assumes the picks it cannot see went where an exact pick would have
// sent them: to the least loaded, filling them up level by level (water
// filling). It then picks at random among the replicas at or below that
// level. With no other instance picking, that is the least loaded, as an
// exact pick.
//
// A candidate the view does not count (not a member in Redis at the last
// reply: instances' backend sets diverge, and another one synced last)
// would read 0 for ever — its own picks leave delta when their batch is
// applied, unrecorded — and take most picks, where an exact pick, which
// picks among members only, never takes it. So it is left out, unless the
// view counts none of the candidates (no reply yet, or none is a member:
// then there is nothing better to go by).

// foreignWeight smooths the other instances' pick rate (per reply).
const foreignWeight = 0.3

// observePicksLocked updates the other instances' pick rate from a reply:
// counter is the pool's pick counter after the batch, applied the picks
// of this batch in it.
func (b *batcher) observePicksLocked(counter float64, applied int64, now time.Time) {
	if !b.pickAt.IsZero() && now.After(b.pickAt) {
		foreign := max(counter-b.pickCount-float64(applied), 0) // < 0: Redis restarted
		rate := foreign / now.Sub(b.pickAt).Seconds()
		// The counter is outside input: +inf, or a jump so large that it
		// reads as an infinite rate, would make the average NaN, which no
		// later reply brings back (every view pick then random).
		if f := b.foreignRate + foreignWeight*(rate-b.foreignRate); !math.IsNaN(f) && !math.IsInf(f, 0) {
			b.foreignRate = f
		}
	}
	b.pickCount, b.pickAt = counter, now
}

// viewPickLocked picks for a request from the view (see above), scanning
// from off among the candidates.
func (b *batcher) viewPickLocked(cands []string, off int, now time.Time) string {
	unseen := b.foreignRate * now.Sub(b.viewAt).Seconds()
	if unseen < 0.05 { // nobody else picks: the least loaded, ties at random
		best, bestN, counted := "", int64(0), false
		for i := range cands {
			a := cands[(i+off)%len(cands)]
			v, ok := b.view[a]
			if counted && !ok {
				continue // an uncounted one, once a counted one is found
			}
			if ok && !counted {
				counted, best = true, "" // the first counted one: forget the others
			}
			if n := v + b.delta[a]; best == "" || n < bestN {
				best, bestN = a, n
			}
		}
		return best
	}
	cands = b.countedLocked(cands)
	scores := make([]float64, len(cands))
	for i, a := range cands {
		scores[i] = float64(b.view[a] + b.delta[a])
	}
	level := waterLevel(scores, unseen)
	k := 0
	for _, s := range scores {
		if s <= level {
			k++
		}
	}
	n := rand.IntN(k)
	for i, s := range scores {
		if s <= level {
			if n == 0 {
				return cands[i]
			}
			n--
		}
	}
	return cands[0] // unreachable: k >= 1 (the least is always at or below the level)
}

// countedLocked is cands less those the view does not count, or cands
// itself when the view counts all of them or none.
func (b *batcher) countedLocked(cands []string) []string {
	n := 0
	for _, a := range cands {
		if _, ok := b.view[a]; ok {
			n++
		}
	}
	if n == len(cands) || n == 0 {
		return cands
	}
	out := make([]string, 0, n)
	for _, a := range cands {
		if _, ok := b.view[a]; ok {
			out = append(out, a)
		}
	}
	return out
}

// waterLevel is the level that units poured onto the lowest of scores
// reach: the smallest L with the sum of max(0, L - s) equal to units.
func waterLevel(scores []float64, units float64) float64 {
	s := slices.Clone(scores)
	slices.Sort(s)
	level := s[0]
	for i := range s {
		next := math.Inf(1)
		if i+1 < len(s) {
			next = s[i+1]
		}
		width := float64(i + 1)
		if need := (next - level) * width; units <= need {
			return level + units/width
		} else {
			units -= need
		}
		level = next
	}
	return level
}
