// Package loadaware implements Heimdall's load-aware routing: enabled,
// weighted scorers rate every replica from 0 (heaviest) to 1 (lightest),
// the weighted sum ranks them, and a max-score picker takes the best,
// keeping the runners-up as the fallback order for retries.
package loadaware

import (
	"math"
	"slices"
	"time"
)

// Scorer names, as in the seed's EndpointPickerConfig.
const (
	Queue           = "queue"
	LoadAware       = "load_aware"
	ActiveRequest   = "active_request"
	SessionAffinity = "session_affinity"
	NoHitLRU        = "no_hit_lru"
	KVCache         = "kv_cache"
	// ActiveTokens is Sluice's own: active_request weighted by each
	// request's size, so ten long generations outweigh ten short ones.
	ActiveTokens = "active_tokens"
)

// AllScorers lists every scorer, in the order scores are reported.
var AllScorers = scorerOrder[:]

// scorerOrder is AllScorers as an array: a pick's weights are indexed by
// it (settings.weights).
var scorerOrder = [...]string{Queue, LoadAware, ActiveRequest, SessionAffinity, NoHitLRU, KVCache, ActiveTokens}

// numScorers is how many scorers there are.
const numScorers = len(scorerOrder)

// affinityScorers are the ones adaptive mode turns down under SLO pressure
// (they keep requests where their context is, at the price of balance);
// the rest measure load and are turned up.
func isAffinity(name string) bool { return name == SessionAffinity || name == NoHitLRU }

// Candidate is what the scorers know of one replica for one request.
type Candidate struct {
	Addr string
	// From the replica's own metrics; MetricsFresh false means unknown or
	// stale, which scores as the heaviest possible: a replica that stopped
	// answering its metrics must not look idle.
	Waiting      float64
	Running      float64 // 0 when not exported
	KVCacheUsage float64 // 0..1
	MetricsFresh bool
	// MetricsUnknown: never read yet (a replica just added, or the first
	// scrape still in flight). Such a replica is neither the worst nor the
	// best on the metric scorers: it gets the mean score of the replicas
	// with fresh metrics. Scoring it 0 made every request of a burst
	// arriving before the first scrapes completed pile onto whichever
	// replica was read first.
	MetricsUnknown bool
	// Sluice's own count of requests in flight (already without those older
	// than request_timeout), and the sum of their estimated tokens.
	Active       int
	ActiveTokens int64
	// LastCold is when this replica last got a cold request (zero: never
	// or no longer tracked).
	LastCold time.Time
	// LastPick orders the replicas by their latest request (0: none yet):
	// equal totals go to the one picked longest ago.
	LastPick uint64
	// Pace is the replica's recent time to last byte per token, seconds
	// (tracker.Pace; 0: none yet).
	Pace float64
	// Even: loaded like the least loaded candidate (markEven); the load
	// scorers score it as that one.
	Even bool
}

// RequestFacts are the request-dependent inputs.
type RequestFacts struct {
	// SessionAddr is the replica the request's session token names ("" if
	// none or unknown).
	SessionAddr string
	// Hot: the request's prompt has a (partial) prefix already routed.
	Hot bool
}

// scoreQueue: fewest waiting → 1, most → 0, linear between; all equal → 1.
func scoreQueue(cs []Candidate, out []float64) {
	minW, maxW, any := 0.0, 0.0, false
	for _, c := range cs {
		if !c.MetricsFresh {
			continue
		}
		if !any || c.Waiting < minW {
			minW = c.Waiting
		}
		if !any || c.Waiting > maxW {
			maxW = c.Waiting
		}
		any = true
	}
	for i, c := range cs {
		switch {
		case !c.MetricsFresh:
			out[i] = 0
		case maxW == minW:
			out[i] = 1
		default:
			out[i] = (maxW - c.Waiting) / (maxW - minW)
		}
	}
}

// scoreLoadAware is llm-d's load-aware scorer with the lighter replica
// scoring higher: no queue → 0.5, a queue of `threshold` or more → 0,
// linear between: 0.5 × (1 − waiting/threshold). (The seed's prose says
// "0.5 + waiting/threshold", which would prefer the busier replica; its
// own description of the goal, and llm-d's code, go the other way.)
// Unlike queue, it does not blow up small absolute differences: 1 vs 2
// waiting score 0.496 vs 0.492, not 1 vs 0.
func scoreLoadAware(cs []Candidate, threshold float64, out []float64) {
	for i, c := range cs {
		switch {
		case !c.MetricsFresh, c.Waiting >= threshold:
			out[i] = 0
		default:
			out[i] = 0.5 * (1 - c.Waiting/threshold)
		}
	}
}

// scoreActive: no active request → 1, the most active → 0, proportional
// (1 − active/max); all idle → 1.
func scoreActive(cs []Candidate, out []float64) {
	for i := range cs {
		out[i] = float64(cs[i].Active)
	}
	scoreInverse(cs, out)
}

// scoreActiveTokens: the same over the estimated tokens in flight (prompt
// + requested output of each unanswered request).
func scoreActiveTokens(cs []Candidate, out []float64) {
	for i := range cs {
		out[i] = float64(cs[i].ActiveTokens)
	}
	scoreInverse(cs, out)
}

// scoreInverse turns each candidate's load in out (≥ 0) into its score,
// relative to the largest: 0 → 1, the largest → 0, linear between; all 0
// → 1. An Even candidate scores as the least loaded one (markEven).
// (Loads in out, not read through a function of a Candidate: a copy of
// each candidate per call made this a sixth of a pick.)
func scoreInverse(cs []Candidate, out []float64) {
	top, least := 0.0, math.Inf(1)
	for _, x := range out[:len(cs)] {
		top, least = max(top, x), min(least, x)
	}
	for i := range cs {
		x := out[i]
		if cs[i].Even {
			x = least
		}
		if top == 0 {
			out[i] = 1
		} else {
			out[i] = 1 - x/top
		}
	}
}

// scoreSession: the replica that served the session before → 1, others 0;
// no (known) session → 0 everywhere (a constant does not change the rank).
func scoreSession(cs []Candidate, f RequestFacts, out []float64) {
	for i, c := range cs {
		out[i] = 0
		if f.SessionAddr != "" && c.Addr == f.SessionAddr {
			out[i] = 1
		}
	}
}

// scoreNoHitLRU: for a cold request, replicas ranked by how long ago they
// last got a cold one: never (or beyond the LRU) → 1, the most recent → 0,
// evenly spaced by rank between. A hot request scores 0.5 everywhere.
func scoreNoHitLRU(cs []Candidate, f RequestFacts, out []float64) {
	if f.Hot {
		for i := range cs {
			out[i] = 0.5
		}
		return
	}
	// Rank the tracked replicas by LastCold, most recent first: the most
	// recent scores 0, the oldest tracked (tracked-1)/tracked, below the 1
	// of replicas never (or no longer) tracked.
	var buf [64]int
	tracked := buf[:0]
	for i, c := range cs {
		if c.LastCold.IsZero() {
			out[i] = 1
		} else {
			tracked = append(tracked, i)
		}
	}
	slices.SortFunc(tracked, func(a, b int) int { return cs[b].LastCold.Compare(cs[a].LastCold) })
	for rank, i := range tracked {
		out[i] = float64(rank) / float64(len(tracked))
	}
}

// neutralForUnknown gives replicas whose metrics were never read the mean
// score of those with fresh metrics (see Candidate.MetricsUnknown).
func neutralForUnknown(cs []Candidate, out []float64) {
	sum, n := 0.0, 0
	for i, c := range cs {
		if c.MetricsFresh {
			sum += out[i]
			n++
		}
	}
	mean := 0.0
	if n > 0 {
		mean = sum / float64(n)
	}
	for i, c := range cs {
		if c.MetricsUnknown && !c.MetricsFresh {
			out[i] = mean
		}
	}
}

// scoreKVCache: 1 − KV-cache utilisation; stale → 0.
func scoreKVCache(cs []Candidate, out []float64) {
	for i, c := range cs {
		if !c.MetricsFresh {
			out[i] = 0
			continue
		}
		out[i] = 1 - min(max(c.KVCacheUsage, 0), 1)
	}
}
