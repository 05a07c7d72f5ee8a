package cacheaware

// Reason says which branch of the policy chose a replica.
type Reason uint8

const (
	// NoReplicas: the set is empty; Decision.Addr is "".
	NoReplicas Reason = iota
	// CacheHit: the best match rate was above CacheThreshold.
	CacheHit
	// Imbalance: the pool was imbalanced, so the least-loaded replica won.
	Imbalance
	// Miss: no match good enough; MissPolicy chose.
	Miss
	// NoUsable: replicas exist but none may get a request now.
	NoUsable
)

func (r Reason) String() string {
	switch r {
	case CacheHit:
		return "cache_hit"
	case Imbalance:
		return "imbalance"
	case Miss:
		return "miss"
	case NoUsable:
		return "no_usable"
	default:
		return "no_replicas"
	}
}

// Decision is Pick's answer.
type Decision struct {
	Addr   string
	Reason Reason
	// MatchedChars is the longest prefix of the text (in runes) any usable
	// replica holds, and MatchRate that over the text's runes. Both are 0
	// when the pool was imbalanced: the tree is not consulted then.
	MatchedChars int
	MatchRate    float64
	// Exact is true when the exact view (engine KV events) chose: the
	// winner's events are fresh and MatchRate is its share of the prompt's
	// tokens in its engine's cache.
	Exact bool
	// Affinity is true when the tree's holders decided among replicas
	// whose engines' views are fresh: no engine held a leading run above
	// CacheThreshold, so the prefix went where Sluice sent it before
	// (the holder with the highest exact rate, then the least loaded).
	Affinity bool
	// Moved is true when such a prompt went to the least pressured
	// replica instead of its home, whose engine kept evicting what it was
	// sent (see PickExact).
	Moved bool
}

// LoadFunc gives a replica's exact in-flight count and whether it may get
// a request now (false: down after failures, or full).
type LoadFunc func(addr string) (inFlight int, usable bool)

// Pick chooses a replica for text of model. load gives each present
// replica's load and usability (nil: all 0 and usable); it is called once
// per replica under the router's read lock, so it must be quick and must
// not call back into the router. Unusable replicas are left out of every
// rule, including the imbalance test. Empty text (a body that could not
// be parsed, or a path without a prompt) is routed by load alone. Pick does not record anything in the tree:
// the caller calls Insert for the replica it really used.
//
// Order of rules, as in SGLang: imbalanced pool → least load; else a
// match rate above CacheThreshold → the replica with the longest match;
// else MissPolicy. Ties on the primary key go to the less loaded replica;
// remaining ties rotate (a counter advanced by every Pick picks which of
// the equal replicas), so equal replicas share new prefixes instead of
// the first one collecting them all. Deterministic for a given sequence of
// calls, which keeps tests exact.
func (r *Router) Pick(model, text string, load LoadFunc) Decision {
	return r.PickWith(model, text, load, nil)
}

// PickWith is Pick with an exact view (nil: none). A replica whose view is
// fresh is scored by its exact rate, and its tree holdings are ignored
// (the engine knows better); the others by the tree as in Pick. The higher
// of the best exact rate and the best tree rate decides, exact on a tie;
// above CacheThreshold it is a hit among the replicas that reach it. exact
// is called under the router's read lock: it must be quick.
func (r *Router) PickWith(model, text string, load LoadFunc, exact ExactFunc) Decision {
	return r.PickExact(model, text, load, exact, nil, nil)
}

// MovePressure: when no engine holds enough of a prompt to route on and
// its home (the tree's holder) is under cache pressure by this much more
// than the least pressured replica, the prompt goes to that replica
// instead (see PickExact).
const MovePressure = 0.25

// RoomPressure: a replica whose pressure is at most this has room (its
// engine rarely stores again what it evicted). A prompt moves only to such
// a replica: when every cache is too small for what it is sent, moving a
// prefix moves the evictions with it and copies the prefix as well.
const RoomPressure = 0.05

// PickExact is PickWith with each replica's cache pressure (nil: none
// known): the share of the blocks its engine stored lately that it had
// evicted before. A prompt no engine holds a leading run above
// CacheThreshold of would go home by the tree (Decision.Affinity); if the
// home's pressure exceeds the least pressured usable replica's by more
// than MovePressure, the home keeps evicting what it is sent (more
// prefixes live there than its cache holds), and the prompt goes to that
// replica instead (Decision.Moved): it is prefilled anyway (its home held
// at most CacheThreshold of it), and from then on it is held where there
// is room. With capacity (nil: none known), a miss fills the caches in
// proportion to their sizes (see roomKeys).
func (r *Router) PickExact(model, text string, load LoadFunc, exact ExactFunc, pressure PressureFunc, capacity CapacityFunc) Decision {
	d := r.decide(model, text, load, exact, pressure, capacity)
	r.count(d)
	return d
}

// count adds d to the decision counters. The Picker counts a decision
// only once its replica is acquired: a pick that lost its choice and
// picks again routes one request, not two.
func (r *Router) count(d Decision) {
	switch d.Reason {
	case CacheHit:
		r.hits.Add(1)
		switch {
		case d.Exact:
			r.exactHits.Add(1)
		case d.Moved:
			r.moves.Add(1)
		case d.Affinity:
			r.affinityHits.Add(1)
		}
	case Miss:
		r.misses.Add(1)
	case Imbalance:
		r.imbalanced.Add(1)
	}
}

// decide is PickExact without counting the decision.
func (r *Router) decide(model, text string, load LoadFunc, exact ExactFunc, pressure PressureFunc, capacity CapacityFunc) Decision {
	text = validText(text)
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := len(r.order)
	if n == 0 {
		return Decision{}
	}
	var buf [64]int
	loads := buf[:0]
	if n > len(buf) {
		loads = make([]int, 0, n)
	}
	var ubuf [64]*replica
	usable := ubuf[:0]
	var mbuf [64]bool
	mask := mbuf[:0] // usable by Router.order index
	if n > len(mbuf) {
		mask = make([]bool, 0, n)
	}
	minL, maxL := 0, 0
	for _, rep := range r.order {
		l, ok := 0, true
		if load != nil {
			l, ok = load(rep.addr)
		}
		loads = append(loads, l)
		mask = append(mask, ok)
		if !ok {
			continue
		}
		if len(usable) == 0 || l < minL {
			minL = l
		}
		if len(usable) == 0 || l > maxL {
			maxL = l
		}
		usable = append(usable, rep)
	}
	if len(usable) == 0 {
		return Decision{Reason: NoUsable}
	}
	turn := r.rr.Add(1)
	if text == "" {
		return Decision{Addr: choose(usable, loads, nil, turn).addr, Reason: Miss}
	}

	if maxL-minL > r.cfg.BalanceAbsThreshold && float64(maxL) > r.cfg.BalanceRelThreshold*float64(minL) {
		return Decision{Addr: choose(usable, loads, nil, turn).addr, Reason: Imbalance}
	}

	var d Decision
	var hit *node
	if total := runeCount(text); total > 0 {
		if root := r.trees[modelKey(model)]; root != nil {
			hit, d.MatchedChars = matchFor(root, text, mask)
			d.MatchRate = float64(d.MatchedChars) / float64(total)
		}
	}
	var cbuf, ebuf, abuf [64]*replica
	cand := cbuf[:0]     // usable tree holders not scored exactly (stale)
	affinity := abuf[:0] // usable tree holders whose engine's view is fresh
	if hit != nil {
		for _, h := range hit.holders {
			if h.rep.dead || !mask[h.rep.idx] {
				continue
			}
			if exact != nil {
				if _, fresh := exact(h.rep.addr); fresh {
					affinity = append(affinity, h.rep)
					continue
				}
			}
			cand = append(cand, h.rep)
		}
	}
	if exact != nil {
		ecand, erate := bestExact(usable, exact, ebuf[:0])
		if erate > r.cfg.CacheThreshold && (len(cand) == 0 || erate >= d.MatchRate) {
			d.MatchRate, d.Exact = erate, true
			d.Addr, d.Reason = choose(ecand, loads, nil, turn).addr, CacheHit
			return d
		}
	}
	// No engine holds a leading run above the threshold. Route as the tree
	// would: its holders are where Sluice sent this prefix before (its
	// home), and sending it there again re-caches it where part of it may
	// still be, instead of copying it to the least-loaded replica. A stale
	// holder is scored by the tree's rate, a fresh one by its engine's
	// (below the threshold); the highest first, then the least loaded.
	if d.MatchRate > r.cfg.CacheThreshold && len(cand)+len(affinity) > 0 {
		if len(cand) > 0 {
			d.Addr = choose(cand, loads, nil, turn).addr
		} else {
			home := choose(affinity, loads, func(rep *replica) int {
				rate, _ := exact(rep.addr)
				return -int(rate * (1 << 20)) // higher exact rate first
			}, turn)
			if to := r.relieve(home, usable, loads, pressure, turn); to != nil {
				d.Addr, d.Moved = to.addr, true
			} else {
				d.Addr, d.Affinity = home.addr, true
			}
		}
		d.Reason = CacheHit
		return d
	}

	smallest := func(rep *replica) int { return rep.chars }
	if r.cfg.MissPolicy == MissSmallestTree {
		d.Addr, d.Reason = choose(usable, loads, smallest, turn).addr, Miss
		return d
	}
	// With every cache's size known, the room decides and load only
	// breaks ties: at light load "least loaded" is whichever replica is
	// idle at that instant, which spreads prefixes by luck, not by room.
	var kbuf [64]int
	if keys, ok := roomKeys(usable, capacity, kbuf[:], n); ok {
		room := func(rep *replica) int { return keys[rep.idx] }
		d.Addr, d.Reason = choose(usable, loads, room, turn).addr, Miss
		return d
	}
	// Least load; among the least loaded, the smallest tree. A new prefix
	// then goes where the fewest prompts live, so prefixes spread evenly
	// over the caches instead of by the luck of the turn, and instances
	// sharing a tree (whose own loads are a fraction of the pool's) agree.
	var lbuf [64]*replica
	least := lbuf[:0]
	for _, rep := range usable {
		if loads[rep.idx] == minL {
			least = append(least, rep)
		}
	}
	d.Addr, d.Reason = choose(least, loads, smallest, turn).addr, Miss
	return d
}

// relieve returns the least pressured usable replica (the less loaded of
// equals) when home's pressure exceeds its own by more than MovePressure;
// nil otherwise.
func (r *Router) relieve(home *replica, usable []*replica, loads []int, pressure PressureFunc, turn uint64) *replica {
	if pressure == nil {
		return nil
	}
	const scale = 1 << 20
	low := choose(usable, loads, func(rep *replica) int { return int(pressure(rep.addr) * scale) }, turn)
	if pressure(home.addr)-pressure(low.addr) > MovePressure && pressure(low.addr) <= RoomPressure {
		return low
	}
	return nil
}

// choose returns the candidate with the lowest (key, load) (key nil: load
// alone); among several equal ones, the (turn mod count)-th, so equal
// replicas take turns. cand must not be empty.
func choose(cand []*replica, loads []int, key func(*replica) int, turn uint64) *replica {
	k := func(rep *replica) int {
		if key == nil {
			return 0
		}
		return key(rep)
	}
	bk, bl, ties := 0, 0, 0
	for i, rep := range cand {
		ck, cl := k(rep), loads[rep.idx]
		switch {
		case i == 0 || ck < bk || (ck == bk && cl < bl):
			bk, bl, ties = ck, cl, 1
		case ck == bk && cl == bl:
			ties++
		}
	}
	nth := int(turn % uint64(ties))
	for _, rep := range cand {
		if k(rep) == bk && loads[rep.idx] == bl {
			if nth == 0 {
				return rep
			}
			nth--
		}
	}
	panic("unreachable")
}
