package cacheaware

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Router is one pool's cache-aware state: a tree per model, the replica
// set, and counters. It outlives config reloads (the adapter keeps it per
// pool and calls Configure).
//
// Size bound: MaxTreeSize counts the runes of node labels across all the
// Router's trees; a label is counted once however many replicas hold it.
// The bound is global rather than per model (or per replica) because what
// it bounds is memory: a quiet model's unused share is not wasted, and the
// least recently used text goes first whichever model it belongs to, which
// one recency list across all trees gives exactly.
//
// Model names count too, in their own tally under the same bound: a tree
// costs its name's runes plus one (its root), and eviction goes on until
// both the text and the names are within MaxTreeSize. The name comes from
// the client, so without this a flood of distinct names, each with a
// short prompt, grew the map and its roots far past the bound (a million
// one-character prompts: ~440 MB). A separate tally rather than one sum
// leaves the text's bound as it was for a pool's few real models.
//
// Concurrency: one RWMutex covers all trees, so the global recency list
// needs no lock ordering. Pick only reads (RLock, Picks run in parallel);
// Insert, eviction and replica removal write. Every write is short: an
// insert is proportional to its text, and bulk work (periodic eviction,
// dropping a removed replica) runs in batches of evictBatch holdings,
// releasing the lock between batches so Picks are never held up long.
type Router struct {
	setMu sync.Mutex // serialises SetReplicas and Configure

	mu       sync.RWMutex
	cfg      Config
	trees    map[string]*node // model → root
	roots    map[*node]string // root → model, to delete an emptied tree
	lru      holding          // sentinel of the router-wide recency list
	size     int              // runes of all node labels
	names    int              // treeCost of every tree
	nodes    int
	replicas map[string]*replica // present replicas by address
	order    []*replica          // present replicas, in set order

	evictedChars    uint64 // under mu
	evictedHoldings uint64

	rr                       atomic.Uint64 // rotates tie-breaks
	hits, misses, imbalanced atomic.Uint64
	exactHits                atomic.Uint64 // hits the exact view chose
	affinityHits             atomic.Uint64 // hits the tree's holders decided among fresh replicas
	moves                    atomic.Uint64 // such picks sent off a pressured home instead

	// reconf tells Run that Configure changed the settings, so a new
	// eviction interval applies now rather than after the old one ends.
	reconf chan struct{}
}

type replica struct {
	addr  string
	idx   int  // position in Router.order
	dead  bool // removed from the set; its holdings are being dropped
	chars int  // runes of the nodes it holds (for smallest_tree)
	lru   holding
}

// evictBatch bounds the holdings dropped per lock hold in bulk work.
// Dropping one is well under a microsecond, so a batch holds the lock for
// tens of microseconds.
const evictBatch = 256

// New returns an empty router. cfg must be valid after WithDefaults.
func New(cfg Config) *Router {
	r := &Router{
		cfg:      cfg.WithDefaults(),
		trees:    map[string]*node{},
		roots:    map[*node]string{},
		replicas: map[string]*replica{},
		reconf:   make(chan struct{}, 1),
	}
	r.lru.initLists()
	return r
}

// SeedTurns sets where the rotation among equal replicas starts. Every
// instance of a pool starts at 0 unless seeded, so instances that share a
// tree take their turns in lockstep: their first misses all go to the same
// replica. Callers running several instances seed each with a random value;
// tests keep 0 for exact sequences.
func (r *Router) SeedTurns(seed uint64) { r.rr.Store(seed) }

// Configure swaps the config in place (on reload), keeping the trees. A
// smaller MaxTreeSize is reached by batched eviction first, with the old
// bound still applying to inserts meanwhile, then set.
func (r *Router) Configure(cfg Config) {
	cfg = cfg.WithDefaults()
	r.setMu.Lock()
	defer r.setMu.Unlock()
	r.mu.Lock()
	keep := r.cfg.MaxTreeSize
	r.cfg = cfg
	if cfg.MaxTreeSize < keep {
		r.cfg.MaxTreeSize = keep
	}
	r.mu.Unlock()
	r.evictTo(context.Background(), cfg.MaxTreeSize)
	r.mu.Lock()
	r.cfg.MaxTreeSize = cfg.MaxTreeSize
	r.evictLocked(cfg.MaxTreeSize, -1) // what inserts added meanwhile
	r.mu.Unlock()
	select {
	case r.reconf <- struct{}{}:
	default: // Run has a wake-up pending already
	}
}

// SetReplicas makes addrs the present replicas, in order. Replicas that
// stay keep their text; new ones start empty; removed ones leave the trees:
// they are never picked again once this starts, and when it returns their
// holdings are gone and nodes no other replica holds are freed. An address
// removed and later re-added starts empty.
func (r *Router) SetReplicas(addrs []string) {
	r.setMu.Lock()
	defer r.setMu.Unlock()
	r.mu.Lock()
	next := make(map[string]*replica, len(addrs))
	order := make([]*replica, 0, len(addrs))
	for _, a := range addrs {
		if next[a] != nil {
			continue
		}
		rep := r.replicas[a]
		if rep == nil {
			rep = &replica{addr: a}
			rep.lru.initLists()
		}
		rep.idx = len(order)
		next[a] = rep
		order = append(order, rep)
	}
	var gone []*replica
	for a, rep := range r.replicas {
		if next[a] == nil {
			rep.dead = true
			gone = append(gone, rep)
		}
	}
	r.replicas, r.order = next, order
	r.mu.Unlock()

	// Drop from the replica's own list tail: leaf-first for that replica,
	// so a node left without holders never has children.
	for _, rep := range gone {
		for done := false; !done; {
			r.mu.Lock()
			for i := 0; i < evictBatch && rep.lru.rprev != &rep.lru; i++ {
				r.drop(rep.lru.rprev)
			}
			done = rep.lru.rprev == &rep.lru
			r.mu.Unlock()
		}
	}
}

// Insert records that addr now serves text for model. The caller calls it
// after Pick for the replica it really used (which may differ from the
// pick). Unknown or removed addresses are ignored (a SetReplicas raced).
// Text beyond MaxTreeSize characters is cut; then least recently used
// holdings are evicted until the size is within the bound again, so the
// bound holds after every Insert.
func (r *Router) Insert(model, text, addr string) {
	model = modelKey(model)
	text = validText(text)
	if text == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := r.replicas[addr]
	if rep == nil {
		return
	}
	text = cutRunes(text, r.cfg.MaxTreeSize)
	root := r.trees[model]
	if root == nil {
		cost := treeCost(model)
		if cost > r.cfg.MaxTreeSize {
			return // the name alone would pass the bound
		}
		r.names += cost
		// A copy: the key may be cut from a client's model name of
		// megabytes, which the tree must not keep alive (a tree costs
		// only its key's runes against MaxTreeSize).
		model = strings.Clone(model)
		root = &node{}
		r.trees[model] = root
		r.roots[root] = model
	}
	r.insertLocked(root, text, rep)
	// The new path is at the front of the list and fits the bound, as does
	// its tree's name, so this evicts other text (and other trees) first
	// and never the path itself.
	r.evictLocked(r.cfg.MaxTreeSize, -1)
}

// evictLocked drops least recently used holdings until both size and
// names are <= target or limit holdings were dropped (limit < 0: no
// limit). It reports whether the target was reached. A tree whose last
// holding goes is deleted, which frees its name.
func (r *Router) evictLocked(target, limit int) bool {
	for n := 0; r.size > target || r.names > target; n++ {
		if n == limit || r.lru.gprev == &r.lru {
			return false
		}
		freed := r.drop(r.lru.gprev)
		r.evictedChars += uint64(freed)
		r.evictedHoldings++
	}
	return true
}

// evictTo evicts down to target in batches, releasing the lock between
// batches, until done or ctx ends.
func (r *Router) evictTo(ctx context.Context, target int) {
	for ctx.Err() == nil {
		r.mu.Lock()
		done := r.evictLocked(target, evictBatch)
		r.mu.Unlock()
		if done {
			return
		}
	}
}

// EvictOnce trims the trees to the low-water mark, 7/8 of MaxTreeSize, in
// batches. Inserts alone already keep the bound; trimming below it leaves
// headroom so that most inserts need not evict, and moves the bulk of
// eviction off the request path.
func (r *Router) EvictOnce() { r.evictOnce(context.Background()) }

func (r *Router) evictOnce(ctx context.Context) {
	r.mu.RLock()
	target := r.cfg.lowWater()
	r.mu.RUnlock()
	r.evictTo(ctx, target)
}

// Run calls EvictOnce every EvictionInterval until ctx ends. Configure
// restarts the wait with the interval it sets (one Run per router).
func (r *Router) Run(ctx context.Context) {
	for {
		r.mu.RLock()
		every := r.cfg.EvictionInterval
		r.mu.RUnlock()
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-r.reconf:
			t.Stop()
		case <-t.C:
			r.evictOnce(ctx)
		}
	}
}

// Stats is a snapshot of a router's trees and counters.
type Stats struct {
	Chars        int            // runes stored in node labels, all models
	MaxChars     int            // the bound (MaxTreeSize)
	Nodes        int            // nodes, all models
	Models       int            // models with a non-empty tree
	ModelChars   int            // runes charged for the trees: each model name's plus one; bounded by MaxChars too
	ReplicaChars map[string]int // runes of the nodes each present replica holds

	Hits, Misses, Imbalanced uint64 // Pick decisions by reason
	ExactHits                uint64 // the hits the exact view (engine KV events) chose
	AffinityHits             uint64 // the hits no engine held enough for, sent to the tree's holder (see Decision.Affinity)
	Moves                    uint64 // the hits no engine held enough for, sent off a pressured home (see Decision.Moved)
	EvictedChars             uint64 // runes freed by eviction (not by replica removal)
	EvictedHoldings          uint64 // (replica, node) holdings evicted
}

// Stats copies the router's figures under its lock.
func (r *Router) Stats() Stats {
	r.mu.RLock()
	defer r.mu.RUnlock()
	s := Stats{
		Chars: r.size, MaxChars: r.cfg.MaxTreeSize, Nodes: r.nodes, Models: len(r.trees), ModelChars: r.names,
		ReplicaChars: make(map[string]int, len(r.order)),
		Hits:         r.hits.Load(), Misses: r.misses.Load(), Imbalanced: r.imbalanced.Load(),
		ExactHits: r.exactHits.Load(), AffinityHits: r.affinityHits.Load(), Moves: r.moves.Load(),
		EvictedChars: r.evictedChars, EvictedHoldings: r.evictedHoldings,
	}
	for _, rep := range r.order {
		s.ReplicaChars[rep.addr] = rep.chars
	}
	return s
}

// maxModelBytes bounds a model name used as a tree's key: the name comes
// from the client. (The number of trees is bounded by treeCost.)
const maxModelBytes = 128

// treeCost is what a model's tree costs against MaxTreeSize, in the names
// tally: its key's runes and one for its root, so that even an empty or
// one-rune name costs its share of the tree's fixed memory.
func treeCost(key string) int { return runeCount(key) + 1 }

// modelKey is the tree key for a client-given model name: valid UTF-8, at
// most maxModelBytes (cut on a rune boundary).
func modelKey(model string) string {
	model = validText(model)
	if len(model) <= maxModelBytes {
		return model
	}
	cut := maxModelBytes
	for cut > 0 && !utf8.RuneStart(model[cut]) {
		cut--
	}
	return model[:cut]
}

// validText makes text valid UTF-8 so rune counting and rune-boundary
// matching agree (JSON-decoded strings already are).
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// cutRunes returns the first max runes of s.
func cutRunes(s string, max int) string {
	if len(s) <= max {
		return s
	}
	for i := range s {
		if max == 0 {
			return s[:i]
		}
		max--
	}
	return s
}
