package loadaware

// slowerPace: a replica whose pace (time to last byte per token, see
// tracker.View) is this many times the fastest candidate's is slower, not
// noise: identical engines' paces swing well within it, a replica of half
// the speed (2×) is told apart.
const slowerPace = 1.5

// markEven sets Even on the candidates loaded like the least loaded one
// (at most one request more, and the tokens in proportion): the load
// scorers (active_request, active_tokens) score them as the least loaded,
// and equal totals go to the one picked longest ago, as round robin
// spaces them.
//
// Why: between identical batching engines, ranking on every difference
// of one in-flight request sent an engine whose requests had just ended
// two or three new ones in a row, whose prefills then shared (and
// lengthened) a step: on four calibrated engines load_aware's TTFT p50
// was 2–3% above round robin's (bench/results/real-engine-sim-r4-reps.md)
// though its counts were exact. A band of √least requests (the spread of
// random arrivals) closed the gap too, but lost up to 5% on the short
// requests of Heimdall's published mix; one request of slack kept that
// mix as it was.
//
// Only where the band cannot hide a slower or a one-at-a-time replica:
//   - every candidate's engine metrics are fresh, and a replica counts as
//     even only while its engine runs several requests at once (Running
//     ≥ 2: a batch, where one request more costs the others little; a
//     one-at-a-time replica's next request waits for the whole one
//     before it);
//   - a replica whose pace is slowerPace × the fastest's or more is never
//     even: on a mixed fleet a band alone gave the half-speed engines
//     their turns and the TTFT p99 went from 0.35 to 0.49 s.
func markEven(cs []Candidate) {
	if len(cs) < 2 {
		return
	}
	leastN, leastTok, minPace := cs[0].Active, cs[0].ActiveTokens, 0.0
	for _, c := range cs {
		if !c.MetricsFresh {
			return
		}
		leastN, leastTok = min(leastN, c.Active), min(leastTok, c.ActiveTokens)
		if c.Pace > 0 && (minPace == 0 || c.Pace < minPace) {
			minPace = c.Pace
		}
	}
	// Tokens within (leastN+1)/leastN of the least, in integers (a float
	// ratio rounds 3000 × 4/3 below 4000); next to an idle replica, only
	// idle ones are even.
	n := int64(max(leastN, 1))
	for i, c := range cs {
		cs[i].Even = c.Running >= 2 && c.Active <= leastN+1 && c.ActiveTokens*n <= leastTok*(n+1) &&
			(c.Pace == 0 || c.Pace < slowerPace*minPace)
	}
}
