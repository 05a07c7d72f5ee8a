package bench

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"
)

// ---- kv-events: the planned oracle ----------------------------------------

// The oracle of kv-events is a placement planned offline with everything a
// router could know and none can: each engine's KV cache size and its
// eviction rule, the prefix of every request and the whole arrival
// sequence. It gives every prefix one home engine, chosen by local search
// (moves and swaps of prefixes between engines) over a model of the
// engines' caches replaying the run's requests, to maximise the cached
// prompt tokens, with no engine given more than oracleShare of the
// requests. The harness then names each request's home in a header, and
// Caddy routes on that header (see kvEvents). Reading the engines' caches
// directly would add nothing to what the exact index already knows (its
// events lag by milliseconds); what limits hits is which prefixes share
// which cache, so the reference is the best placement, not the freshest
// view. It is a reference, not a proven bound: a dynamic router can in
// principle beat the best static plan (the model's clock is not the
// engines'), so exact above it says the plan is not optimal.

// oracleShare: the most requests one engine may get, as a multiple of the
// mean, so that the oracle's TTFT is not bought with queues. (The replay
// gives within 0.005 of the same hit rate at 1.15, 1.35 or 1.6 on every
// cache shape of kv-events; cache_aware's own runs load one engine up to
// 1.3× the mean.)
const oracleShare = 1.25

// kvCacheModel is one engine's block cache as llm-d-inference-sim v0.10.2
// keeps it (pkg/kv-cache/block_cache.go): blocks in use by running
// requests are kept; a finished request's blocks become unused, all with
// the same timestamp; a new block evicts the oldest unused one (among
// equal timestamps, whichever the map yields: here a seeded hash). Every
// block of the prompt found in the cache counts as a hit, leading or not.
type kvCacheModel struct {
	max    int
	used   map[kvBlock]int
	unused map[kvBlock]int64 // release time
	lru    kvLRU
	seed   uint64
}

// kvBlock is a block: a shared prefix's (prefix ≥ 0, its index) or a
// request's own (prefix -1-n for request n).
type kvBlock struct{ prefix, idx int }

type kvLRUEntry struct {
	at  int64
	tie uint64
	b   kvBlock
}

type kvLRU []kvLRUEntry

func (h kvLRU) Len() int { return len(h) }
func (h kvLRU) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].tie < h[j].tie)
}
func (h kvLRU) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *kvLRU) Push(x any)   { *h = append(*h, x.(kvLRUEntry)) }
func (h *kvLRU) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func newKVCacheModel(blocks int, seed uint64) *kvCacheModel {
	return &kvCacheModel{max: blocks, used: map[kvBlock]int{}, unused: map[kvBlock]int64{}, seed: seed}
}

// start admits a request's blocks and returns how many were cached
// (false: the cache cannot hold them, as the engine refuses it).
func (c *kvCacheModel) start(blocks []kvBlock) (int, bool) {
	cached, fresh := 0, 0
	for _, b := range blocks {
		if _, ok := c.unused[b]; ok {
			cached++
		} else if _, ok := c.used[b]; ok {
			cached++
		} else {
			fresh++
		}
	}
	moved := 0
	for _, b := range blocks {
		if _, ok := c.unused[b]; ok {
			moved++
		}
	}
	if len(c.used)+fresh+moved > c.max {
		return 0, false
	}
	for _, b := range blocks {
		if n, ok := c.used[b]; ok {
			c.used[b] = n + 1
			continue
		}
		if _, ok := c.unused[b]; ok {
			delete(c.unused, b)
			c.used[b] = 1
			continue
		}
		if len(c.used)+len(c.unused) == c.max {
			c.evict()
		}
		c.used[b] = 1
	}
	return cached, true
}

func (c *kvCacheModel) evict() {
	for c.lru.Len() > 0 {
		e := heap.Pop(&c.lru).(kvLRUEntry)
		if at, ok := c.unused[e.b]; ok && at == e.at {
			delete(c.unused, e.b)
			return
		}
	}
}

// finish releases a request's blocks at time at.
func (c *kvCacheModel) finish(blocks []kvBlock, at int64) {
	for _, b := range blocks {
		if n := c.used[b]; n > 1 {
			c.used[b] = n - 1
			continue
		}
		delete(c.used, b)
		c.unused[b] = at
		heap.Push(&c.lru, kvLRUEntry{at, mix64(c.seed ^ mix64(uint64(b.prefix)<<32^uint64(uint32(b.idx)))), b})
	}
}

// kvReplay is the outcome of replaying a plan: cached and queried prompt
// blocks over all engines, and requests per engine.
type kvReplay struct {
	cached, queried int
	perEngine       []int
}

func (r kvReplay) rate() float64 {
	if r.queried == 0 {
		return 0
	}
	return float64(r.cached) / float64(r.queried)
}

// kvReplayPlan replays the requests (arrival times, prefix ids) against
// one cache model per engine, each request going to plan[its prefix].
func kvReplayPlan(k kvBench, sizes []int, arrivals []time.Duration, prefix []int, plan []int, seed uint64) kvReplay {
	out := kvReplay{perEngine: make([]int, k.replicas)}
	for e := range k.replicas {
		r := kvReplayEngine(k, sizes[min(e, len(sizes)-1)], arrivals, prefix, func(p int) bool { return plan[p] == e }, seed)
		out.cached += r.cached
		out.queried += r.queried
		out.perEngine[e] = r.perEngine[0]
	}
	return out
}

// kvReplayEngine replays on one engine with a cache of size blocks the
// requests whose prefix it is given (mine). It runs at most k.maxNumSeqs
// requests, the others wait in arrival order; a request runs for the
// prefill of its uncached tokens plus k.maxTokens inter-token times, as
// the sim's time model has it.
func kvReplayEngine(k kvBench, size int, arrivals []time.Duration, prefix []int, mine func(prefix int) bool, seed uint64) kvReplay {
	perReq := (k.prefixWords + k.uniqueWords) / k.blockSize
	shared := k.prefixWords / k.blockSize
	out := kvReplay{perEngine: make([]int, 1)}
	c := newKVCacheModel(size, seed)
	var reqs []int
	for n, p := range prefix {
		if mine(p) {
			reqs = append(reqs, n)
		}
	}
	out.perEngine[0] = len(reqs)
	type running struct {
		end    int64
		blocks []kvBlock
	}
	var run []running
	var waiting []int
	next := 0
	blocksOf := func(n int) []kvBlock {
		bs := make([]kvBlock, perReq)
		for i := range perReq {
			if i < shared {
				bs[i] = kvBlock{prefix[n], i}
			} else {
				bs[i] = kvBlock{-1 - n, i}
			}
		}
		return bs
	}
	startAt := func(n int, now int64) {
		bs := blocksOf(n)
		cached, ok := c.start(bs)
		if !ok { // the engine would refuse it: count it as a miss
			cached = 0
			bs = nil
		}
		out.cached += cached
		out.queried += perReq
		d := int64(perReq-cached)*int64(k.blockSize)*int64(k.prefillToken) + int64(k.maxTokens)*int64(k.interToken)
		run = append(run, running{now + d, bs})
	}
	for next < len(reqs) || len(run) > 0 || len(waiting) > 0 {
		// the earliest completion, if it comes before the next arrival
		first := -1
		for i, r := range run {
			if first < 0 || r.end < run[first].end {
				first = i
			}
		}
		if first >= 0 && (next >= len(reqs) || run[first].end <= int64(arrivals[reqs[next]])) {
			now := run[first].end
			c.finish(run[first].blocks, now)
			run = append(run[:first], run[first+1:]...)
			if len(waiting) > 0 {
				startAt(waiting[0], now)
				waiting = waiting[1:]
			}
			continue
		}
		if next >= len(reqs) {
			break
		}
		n := reqs[next]
		next++
		if len(run) < k.maxNumSeqs {
			startAt(n, int64(arrivals[n]))
		} else {
			waiting = append(waiting, n)
		}
	}
	return out
}

// kvOraclePlan returns the oracle's home engine per prefix and its replay:
// a capacity-weighted start (the most requested prefixes first, each to
// the engine with the most cache left per prefix block), then moves and
// swaps of prefixes between engines while any raises the replayed hits
// without an engine exceeding oracleShare of the mean requests. At most
// 64 prefixes (an engine's set is a bit mask).
func kvOraclePlan(k kvBench, sizes []int, arrivals []time.Duration, prefix []int) ([]int, kvReplay) {
	if k.prefixes > 64 {
		panic("kvOraclePlan: more than 64 prefixes")
	}
	seed := k.seed
	count := make([]int, k.prefixes)
	for _, p := range prefix {
		count[p]++
	}
	limit := int(oracleShare * float64(len(prefix)) / float64(k.replicas))
	order := make([]int, k.prefixes)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return count[order[a]] > count[order[b]] })
	shared := k.prefixWords / k.blockSize
	room := make([]int, k.replicas)
	load := make([]int, k.replicas)
	for e := range room {
		room[e] = sizes[min(e, len(sizes)-1)]
	}
	plan := make([]int, k.prefixes)
	for _, p := range order {
		best := -1
		for e := range room {
			if load[e]+count[p] > limit {
				continue
			}
			if best < 0 || room[e] > room[best] || (room[e] == room[best] && load[e] < load[best]) {
				best = e
			}
		}
		if best < 0 { // every engine at its limit: the least loaded
			best = 0
			for e := range load {
				if load[e] < load[best] {
					best = e
				}
			}
		}
		plan[p] = best
		room[best] -= shared
		load[best] += count[p]
	}
	fits := func(pl []int) bool {
		l := make([]int, k.replicas)
		for _, p := range prefix {
			l[pl[p]]++
		}
		for _, n := range l {
			if n > limit {
				return false
			}
		}
		return true
	}
	best, bestPlan := kvReplay{}, []int(nil)
	starts := [][]int{plan}
	rng := rand.New(rand.NewPCG(k.seed, 0x0ac1e))
	for len(starts) < oracleStarts {
		cand := make([]int, k.prefixes)
		for p := range cand {
			cand[p] = rng.IntN(k.replicas)
		}
		if fits(cand) {
			starts = append(starts, cand)
		}
	}
	for _, st := range starts {
		pl, r := kvClimb(k, sizes, arrivals, prefix, st, fits, seed)
		if bestPlan == nil || r.cached > best.cached {
			best, bestPlan = r, pl
		}
	}
	return bestPlan, best
}

// oracleStarts: the local search starts from the capacity-weighted plan
// and from random ones, and keeps the best it climbs to (one climb stops
// at a local optimum).
const oracleStarts = 4

// kvClimb moves single prefixes to other engines and swaps pairs while any
// such change raises the replayed hits and fits. An engine's replay
// depends only on its own prefixes, so each is replayed once per set.
func kvClimb(k kvBench, sizes []int, arrivals []time.Duration, prefix []int, start []int, fits func([]int) bool, seed uint64) ([]int, kvReplay) {
	type set struct {
		engine int
		mask   uint64
	}
	memo := map[set]kvReplay{}
	replay := func(pl []int) kvReplay {
		out := kvReplay{perEngine: make([]int, k.replicas)}
		for e := range k.replicas {
			var m uint64
			for p, h := range pl {
				if h == e {
					m |= 1 << p
				}
			}
			r, ok := memo[set{e, m}]
			if !ok {
				r = kvReplayEngine(k, sizes[min(e, len(sizes)-1)], arrivals, prefix, func(p int) bool { return m&(1<<p) != 0 }, seed)
				memo[set{e, m}] = r
			}
			out.cached += r.cached
			out.queried += r.queried
			out.perEngine[e] = r.perEngine[0]
		}
		return out
	}
	plan := append([]int(nil), start...)
	best := replay(plan)
	cand := make([]int, len(plan))
	try := func() bool {
		if !fits(cand) {
			return false
		}
		if r := replay(cand); r.cached > best.cached {
			best = r
			copy(plan, cand)
			return true
		}
		return false
	}
	for improved := true; improved; {
		improved = false
		for p := range plan {
			for e := range k.replicas {
				if e == plan[p] {
					continue
				}
				copy(cand, plan)
				cand[p] = e
				improved = try() || improved
			}
		}
		for p := range plan {
			for q := p + 1; q < len(plan); q++ {
				if plan[p] == plan[q] {
					continue
				}
				copy(cand, plan)
				cand[p], cand[q] = plan[q], plan[p]
				improved = try() || improved
			}
		}
	}
	return plan, best
}

// mix64 is splitmix64's finaliser: a fixed pseudo-random tie-break.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// oracleProxy is the oracle's Caddy site: the request goes to the engine
// its X-Oracle-Home names (the harness sets it from the plan), through
// Caddy's reverse_proxy as every Caddy system's does; a request without
// it (none in the run) is answered 421, so that a wiring fault shows as
// errors.
func oracleProxy(addrs []string) string {
	var b strings.Builder
	b.WriteString("route {\n")
	for i, a := range addrs {
		fmt.Fprintf(&b, "\t@home%d header X-Oracle-Home %d\n\treverse_proxy @home%d %s\n", i, i, i, a)
	}
	b.WriteString("\trespond \"no X-Oracle-Home\" 421\n}")
	return b.String()
}

// kvOraclePlans keeps each shape's plan for the run's later reps (the
// same requests, the same plan).
var kvOraclePlans = struct {
	sync.Mutex
	m map[string]kvOracle
}{m: map[string]kvOracle{}}

type kvOracle struct {
	home   []int
	replay kvReplay
	blind  kvReplay
}

// blindDraws: the draws of the workload the blind plan is made from, one
// after the other (more draws: closer to the workload's expected counts).
const blindDraws = 3

// kvOracleFor returns the oracle's plan for one cache shape, its replay,
// and the replay on the run's requests of a plan made without them: from
// other draws of the same workload (other arrival times and prefix draws,
// the same rates), what a router that knows the caches and the prefix set
// but not the dice could plan. The gap between the two replays
// is what the oracle gains from knowing which prefixes this run happened
// to draw more often.
func kvOracleFor(k kvBench, sizes []int, arrivals []time.Duration, bodies []engineBody) (home []int, replay, blind kvReplay) {
	key := fmt.Sprintf("%+v %v %d", k, sizes, len(arrivals))
	kvOraclePlans.Lock()
	defer kvOraclePlans.Unlock()
	if o, ok := kvOraclePlans.m[key]; ok {
		return o.home, o.replay, o.blind
	}
	prefix := make([]int, len(bodies))
	for i, b := range bodies {
		prefix[i] = b.prefix
	}
	home, replay = kvOraclePlan(k, sizes, arrivals, prefix)
	var oArr []time.Duration
	var oPrefix []int
	for d := range blindDraws {
		other := k
		other.seed = k.seed + 1000*uint64(d+1)
		arr := poisson(other.rate, other.arrivals, other.seed)
		for i, b := range kvBodies(other, kvPrompts(other), len(arr)) {
			oArr = append(oArr, time.Duration(d)*other.arrivals+arr[i])
			oPrefix = append(oPrefix, b.prefix)
		}
	}
	oHome, _ := kvOraclePlan(k, sizes, oArr, oPrefix)
	blind = kvReplayPlan(k, sizes, arrivals, prefix, oHome, k.seed)
	kvOraclePlans.m[key] = kvOracle{home, replay, blind}
	return home, replay, blind
}
