package loadaware

import (
	"container/list"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Policy is one pool's scoring state: the no_hit_lru history and the
// adaptive weight shift. It is safe for concurrent use.
type Policy struct {
	mu      sync.Mutex
	cfg     Config
	pick    settings                 // cfg as a pick reads it
	cold    map[string]*list.Element // addr → element of coldLRU (value coldEntry)
	coldLRU list.List                // most recent cold request at the front
	shift   float64                  // adaptive: 0 normal … 1 all weight on load
	ttft    float64                  // EWMA of time to first byte, seconds
}

type coldEntry struct {
	addr string
	at   time.Time
}

// New returns a policy; cfg must be valid.
func New(cfg Config) *Policy {
	cfg = ownWeights(cfg.WithDefaults())
	return &Policy{cfg: cfg, pick: settingsOf(cfg), cold: map[string]*list.Element{}}
}

// settings is what one pick reads of the config and the adaptive shift,
// copied at once under the lock, so that a reload cannot give one pick
// the weights of one config and the rest of another. The weights are
// indexed as AllScorers (no map lookup per scorer).
type settings struct {
	weights        [numScorers]float64 // as configured (before the shift)
	shift          float64
	threshold      float64
	k              int // MaxNumEndpoints
	hotPrefixChars int
	requestTimeout time.Duration
	slo            time.Duration
}

func settingsOf(c Config) settings {
	s := settings{threshold: c.Threshold, k: c.MaxNumEndpoints, hotPrefixChars: c.HotPrefixChars,
		requestTimeout: c.RequestTimeout, slo: c.SLO}
	for i, name := range scorerOrder {
		s.weights[i] = c.Weights[name]
	}
	return s
}

// uses: the scorer named is on (adaptive mode scales weights but never
// turns a scorer on or off).
func (s *settings) uses(name string) bool {
	i := slices.Index(scorerOrder[:], name)
	return i >= 0 && s.weights[i] > 0
}

// settings is the config and shift a pick runs with.
func (p *Policy) settings() settings {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.pick
	s.shift = p.shift
	return s
}

// ownWeights copies the weights: rank reads them outside the lock, so no
// caller may keep a handle that writes them.
func ownWeights(c Config) Config {
	c.Weights = maps.Clone(c.Weights)
	return c
}

// Configure swaps the config, keeping history.
func (p *Policy) Configure(cfg Config) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg = ownWeights(cfg.WithDefaults())
	p.pick = settingsOf(p.cfg)
	for p.coldLRU.Len() > p.cfg.LRUSize {
		p.evictOldestLocked()
	}
	if p.cfg.SLO == 0 {
		// Off: nothing is observed meanwhile, so the EWMA would be
		// of an old period when the mode is turned on again.
		p.shift, p.ttft = 0, 0
	}
}

// Config returns the config in force (with defaults).
func (p *Policy) Config() Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// LastCold is when addr last got a cold request, zero if never or no
// longer tracked (beyond lru_size).
func (p *Policy) LastCold(addr string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.cold[addr]; ok {
		return e.Value.(coldEntry).at
	}
	return time.Time{}
}

// NoteCold records that addr got a cold request at now.
func (p *Policy) NoteCold(addr string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.cold[addr]; ok {
		e.Value = coldEntry{addr, now}
		p.coldLRU.MoveToFront(e)
		return
	}
	p.cold[addr] = p.coldLRU.PushFront(coldEntry{addr, now})
	for p.coldLRU.Len() > p.cfg.LRUSize {
		p.evictOldestLocked()
	}
}

func (p *Policy) evictOldestLocked() {
	e := p.coldLRU.Back()
	p.coldLRU.Remove(e)
	delete(p.cold, e.Value.(coldEntry).addr)
}

// Forget drops replicas no longer in the set from the history.
func (p *Policy) Forget(keep map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, e := range p.cold {
		if !keep[addr] {
			p.coldLRU.Remove(e)
			delete(p.cold, addr)
		}
	}
}

// ObserveTTFT feeds adaptive mode with one completed request's time to
// first byte.
func (p *Policy) ObserveTTFT(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.SLO == 0 {
		return
	}
	const alpha = 0.2
	x := d.Seconds()
	if p.ttft == 0 {
		p.ttft = x
	} else {
		p.ttft = alpha*x + (1-alpha)*p.ttft
	}
	if p.ttft > p.cfg.SLO.Seconds() {
		p.shift = min(1, p.shift+p.cfg.AdaptiveStep)
	} else {
		p.shift = max(0, p.shift-p.cfg.AdaptiveStep)
	}
}

// Shift is the adaptive weight shift in force (0 = configured weights).
func (p *Policy) Shift() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.shift
}

// Weights returns the effective weights: load scorers × (1 + shift),
// affinity scorers × (1 − shift).
func (p *Policy) Weights() map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]float64, len(p.cfg.Weights))
	for name, w := range p.cfg.Weights {
		out[name] = effectiveWeight(name, w, p.shift)
	}
	return out
}

func effectiveWeight(name string, w, shift float64) float64 {
	if isAffinity(name) {
		return w * (1 - shift)
	}
	return w * (1 + shift)
}

// Uses reports whether scorer name has a weight above 0 (adaptive mode
// scales weights but never turns a scorer on or off).
func (p *Policy) Uses(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pick.uses(name)
}

// Ranking is the outcome of scoring one request.
type Ranking struct {
	// Order holds candidate indices, best first, at most MaxNumEndpoints:
	// the pick, then the fallback order for retries.
	Order []int
	// Total is each candidate's weighted score; Scores[s][i] scorer s's.
	Total  []float64
	Scores map[string][]float64
}

// Rank scores every candidate with the enabled scorers and returns the
// max-score order. Equal totals go to the replica picked longest ago
// (LastPick), then at random, so equal replicas share the load instead
// of the first one taking it all, and take turns as round robin spaces
// them: a batching engine takes newcomers best one at a time (each
// prefill stalls the decodes of its step). At random alone, one of four
// engines with equal counts got two requests in a row about once a
// round. It marks the candidates whose load is even (markEven) in cs.
func (p *Policy) Rank(cs []Candidate, f RequestFacts) Ranking {
	st := p.settings()
	order, total, scores := st.rank(cs, f, true, nil, nil)
	return Ranking{Order: order, Total: total, Scores: scores}
}

// rank is Rank's Order, Total and Scores; without explain, Scores stays
// nil and every scorer writes into one scratch slice. buf (2 per
// candidate) and order (1), when large enough, hold Total, the scratch
// scores and Order: a pick on the hot path passes them on its stack and
// allocates nothing here. (Three results, not a Ranking: the compiler
// would take a Ranking's Scores, which Explain keeps, for stack memory
// and move the buffers to the heap.)
func (st *settings) rank(cs []Candidate, f RequestFacts, explain bool, buf []float64, order []int) ([]int, []float64, map[string][]float64) {
	n := len(cs)
	if cap(buf) < 2*n {
		buf = make([]float64, 2*n)
	}
	buf = buf[:2*n]
	clear(buf)
	total := buf[:n:n]
	scratch := buf[n:]
	markEven(cs)
	var scores map[string][]float64
	if explain {
		scores = make(map[string][]float64, numScorers)
	}
	for i, name := range scorerOrder {
		w := st.weights[i]
		if w <= 0 {
			continue
		}
		w = effectiveWeight(name, w, st.shift)
		s := scratch
		if explain {
			own := make([]float64, n) // kept: not the (maybe stack) scratch
			scores[name] = own
			s = own
		}
		switch name {
		case Queue:
			scoreQueue(cs, s)
		case LoadAware:
			scoreLoadAware(cs, st.threshold, s)
		case ActiveRequest:
			scoreActive(cs, s)
		case ActiveTokens:
			scoreActiveTokens(cs, s)
		case SessionAffinity:
			scoreSession(cs, f, s)
		case NoHitLRU:
			scoreNoHitLRU(cs, f, s)
		case KVCache:
			scoreKVCache(cs, s)
		}
		if name == Queue || name == LoadAware || name == KVCache {
			neutralForUnknown(cs, s)
		}
		for i := range s {
			total[i] += w * s[i]
		}
	}
	return maxScoreOrder(total, cs, st.k, order), total, scores
}

// maxScoreOrder returns up to k indices by descending total; among equal
// totals the smallest LastPick comes first, and among those each is
// equally likely to (reservoir sampling).
// order's storage is used if it holds k.
func maxScoreOrder(total []float64, cs []Candidate, k int, order []int) []int {
	k = min(k, len(total))
	if cap(order) < k {
		order = make([]int, 0, k)
	}
	order = order[:0]
	// taken marks the candidates placed, for a long order: looked up in
	// order itself, k places over n candidates cost n·k² (213 ms a pick
	// at max_num_endpoints 1024 over 1024 replicas); a short order is
	// searched, which allocates nothing on the hot path (k is 1 unless
	// set).
	var taken []bool
	if k > takenAbove {
		taken = make([]bool, len(total))
	}
	for len(order) < k {
		best, ties := -1, 0
		for i, t := range total {
			if taken != nil && taken[i] || taken == nil && slices.Contains(order, i) {
				continue
			}
			switch {
			case best < 0 || t > total[best] || (t == total[best] && cs[i].LastPick < cs[best].LastPick):
				best, ties = i, 1
			case t == total[best] && cs[i].LastPick == cs[best].LastPick:
				ties++
				if rand.IntN(ties) == 0 {
					best = i
				}
			}
		}
		order = append(order, best)
		if taken != nil {
			taken[best] = true
		}
	}
	return order
}

// takenAbove is the longest order maxScoreOrder searches for placed
// candidates instead of marking them.
const takenAbove = 8
