package kvevents

import (
	"math"
	"strconv"
	"sync"
	"time"
)

// Config sizes an Index. Zero values take the defaults.
type Config struct {
	// BlockSize is Sluice's key block in tokens (default 16). Prefixes are
	// matched in whole blocks of this size.
	BlockSize int
	// MaxBlocksPerReplica bounds the engine blocks remembered per replica
	// (default 65536, about 1M tokens at block size 16); the oldest go first.
	// An engine block counts as the key blocks it completes, at least one
	// (see weight).
	MaxBlocksPerReplica int
	// MaxBlocksTotal bounds them over all replicas (default 524288); the
	// oldest of the largest replica go first.
	MaxBlocksTotal int
	// Seed is mixed into the root key; instances that share keys must agree.
	Seed uint64
}

func (c Config) withDefaults() Config {
	if c.BlockSize <= 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.MaxBlocksPerReplica <= 0 {
		c.MaxBlocksPerReplica = 1 << 16
	}
	if c.MaxBlocksTotal <= 0 {
		c.MaxBlocksTotal = 1 << 19
	}
	return c
}

// Bounds on what a publisher can make the index track besides blocks.
const (
	maxTopics            = 4096 // sequence trackers (topic, rank)
	maxSourcesPerReplica = 64   // (data-parallel rank, medium) pairs; (topic, rank) trackers too
)

// Index is, per replica, the set of Sluice block keys its engine holds,
// rebuilt from the engine's KV events. One mutex guards everything.
type Index struct {
	mu       sync.Mutex
	cfg      Config
	keyer    keyer
	replicas map[string]*replica
	total    int // engine blocks held, all replicas
	totalW   int // their weight (see weight), what MaxBlocksTotal bounds
	seqs     map[seqKey]seqState
	// noIdleBefore: no topic can be idle for topicIdle before this time
	// (the oldest was last seen topicIdle before it), so a full table of
	// active topics costs one scan per idle horizon, not one per message.
	noIdleBefore time.Time
	c            counters
	// tombs: engine blocks removed recently, oldest first, all replicas
	// (see tomb).
	tombHead, tombTail *tomb
	tombs              int // their weight (see weight), what maxTombs bounds
	// adapters: the LoRA adapters' names the events named lately, so a
	// request whose model is one is keyed as the adapter's (KeysFor).
	adapters adapterSet
}

// maxAdapters bounds the adapters' names remembered: the names come from
// the publishers (outside input).
const maxAdapters = 1024

// adapterSet is a bounded set of recently seen names: two generations of
// at most maxAdapters/2 each; a full current one becomes the previous,
// dropping the previous's names not seen since (a name seen again moves
// to the current one).
type adapterSet struct {
	cur, prev map[string]struct{}
}

func (a *adapterSet) add(name string) {
	if _, ok := a.cur[name]; ok {
		return
	}
	if a.cur == nil || len(a.cur) >= maxAdapters/2 {
		a.prev, a.cur = a.cur, make(map[string]struct{})
	}
	a.cur[name] = struct{}{}
}

func (a *adapterSet) has(name string) bool {
	_, inCur := a.cur[name]
	_, inPrev := a.prev[name]
	return inCur || inPrev
}

func (a *adapterSet) len() int { return len(a.cur) + len(a.prev) }

// tomb remembers an engine block the engine removed: its hash, keys and
// keying state. An engine's block hash names the whole prefix up to that
// block (vLLM, SGLang and llm-d-inference-sim chain each hash from its
// parent's), so when the engine stores the same hash again the block has
// the same keys, whatever parent its event names: llm-d-inference-sim
// v0.10.2 evicts from the middle of a prompt and re-stores the missing
// blocks in one event whose parent is the last block it still held.
type tomb struct {
	r          *replica
	key        tombKey
	keys       []uint64
	state      chain
	prev, next *tomb
}

type tombKey struct {
	src  source
	hash BlockHash
}

// maxTombs bounds the removed blocks remembered, all replicas, by weight.
func (ix *Index) maxTombs() int { return max(ix.cfg.MaxBlocksTotal/4, 1024) }

type seqKey struct {
	topic string
	rank  int
}

// seqState is a topic's (and rank's) last sequence applied, the replica
// it fed, and when.
type seqState struct {
	seq  uint64
	name string
	at   time.Time
}

// topicIdle: with the topic table full, a topic silent this long gives
// its slot to a new one (replicas come and go: a replaced pod publishes
// under a new address, so new topics).
const topicIdle = 10 * time.Minute

// source is one cache of a replica: a data-parallel rank, a medium (GPU,
// CPU offload...) and a KV-cache group (vLLM's group_idx; 0 without one).
// Engine hashes are unique only within one: vLLM's groups publish their
// blocks under the same hashes, and each group evicts its own.
type source struct {
	rank   int
	medium string
	group  int
}

type replica struct {
	keys    map[uint64]int32     // Sluice key -> engine blocks that complete it
	spec    map[uint64]time.Time // speculative keys (just routed there) -> expiry
	sources map[source]map[BlockHash]*entry
	tombs   map[tombKey]*tomb
	// groupMain: what the replica's stores said of its KV-cache groups'
	// kinds (true: full attention), at most maxGroupIdx+1; primary: the
	// group keyed (see keyedGroup), -1 before the first.
	groupMain  map[int]bool
	primary    int
	head, tail *entry // oldest first
	topics     int    // sequence trackers naming it (at most maxSourcesPerReplica)
	n          int    // engine blocks
	w          int    // their weight (see weight), what MaxBlocksPerReplica bounds
	lastEvent  time.Time
	// Blocks stored and, of those, stored again after their removal,
	// decayed with half-life pressureHalfLife from pressureAt: see Pressure.
	stored, reStored float64
	pressureAt       time.Time
}

// pressureHalfLife is how fast a replica's re-store share forgets.
const pressureHalfLife = 10 * time.Second

// countStore adds one stored block to the replica's re-store share.
func (r *replica) countStore(now time.Time, again bool) {
	if !r.pressureAt.IsZero() && now.After(r.pressureAt) {
		f := math.Exp2(-float64(now.Sub(r.pressureAt)) / float64(pressureHalfLife))
		r.stored *= f
		r.reStored *= f
	}
	if now.After(r.pressureAt) {
		r.pressureAt = now
	}
	r.stored++
	if again {
		r.reStored++
	}
}

// Pressure returns, per replica, the share of the blocks its engine
// stored lately (half-life 10 s) that it had removed before and stored
// again: the engine evicting what it is then asked for, its cache too
// small for what it is sent. 0 for a replica the index has not heard of.
func (ix *Index) Pressure(replicas []string) []float64 {
	out := make([]float64, len(replicas))
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for i, name := range replicas {
		if r := ix.replicas[name]; r != nil && r.stored > 0 {
			out[i] = r.reStored / r.stored
		}
	}
	return out
}

// entry is one engine block: the keys it completes (evicted with it) and
// the keying state after it (its children chain from there).
type entry struct {
	hash  BlockHash
	src   source
	keys  []uint64
	state chain
	// copies: engine blocks stored under this hash and not yet removed.
	// vLLM does not de-duplicate: two requests that fill the same prefix
	// at once each cache their own block under one hash, with a
	// BlockStored each and a BlockRemoved each when evicted; the prefix
	// stays cached until the last goes.
	copies     int
	prev, next *entry
}

// weight is what a block counts in the bounds: the keys it completes, at
// least one. An engine block of 4096 tokens holds 256 keys (some 11 KiB);
// counted as one, big blocks (an engine's, or a hostile publisher's) made
// the index hold up to 256 times its bounds (about 6 GiB at the defaults).
func weight(keys []uint64) int { return max(1, len(keys)) }

// NewIndex returns an empty index.
func NewIndex(cfg Config) *Index {
	cfg = cfg.withDefaults()
	return &Index{
		cfg:      cfg,
		keyer:    newKeyer(cfg.BlockSize, cfg.Seed),
		replicas: make(map[string]*replica),
		seqs:     make(map[seqKey]seqState),
		c:        newCounters(),
	}
}

// BlockSize is the key block size in tokens.
func (ix *Index) BlockSize() int { return ix.cfg.BlockSize }

// Keys returns the Sluice keys of every full block of tokens of the base
// model, to pass to Match.
func (ix *Index) Keys(tokens []uint32) []uint64 { return ix.keyer.keys(tokens) }

// KeysFor returns the keys of a request's tokens: under its LoRA adapter
// when model is the name of one the engines' events named (vLLM's OpenAI
// server takes an adapter's name as the request's model), else the base
// model's; with salt (the request's cache_salt) under that salt. An
// engine reuses neither namespace's blocks for the other.
func (ix *Index) KeysFor(model, salt string, tokens []uint32) []uint64 {
	return ix.keysForTag(model, SaltTag(salt), tokens)
}

// keysForTag is KeysFor with the salt given by its SaltTag.
func (ix *Index) keysForTag(model, saltTag string, tokens []uint32) []uint64 {
	ns := namespace{salt: saltTag}
	if model != "" {
		ix.mu.Lock()
		if ix.adapters.has(model) {
			ns.adapter = "n" + model
		}
		ix.mu.Unlock()
	}
	return ix.keyer.keysIn(ns, tokens)
}

// adapterOf is the namespace's adapter of a BlockStored: its LoRA name, or
// its id when it gives none (vLLM's ids start at 1: 0 and below are taken
// for none; such a chain is held without keys, see store).
func adapterOf(ev *Event) string {
	switch {
	case ev.LoraName != "":
		return "n" + ev.LoraName
	case ev.HasLora && ev.LoraID > 0:
		return "i" + strconv.FormatInt(ev.LoraID, 10)
	}
	return ""
}

// extraKeyed says whether block i's extra keys are ones Sluice reproduces
// from a request, and returns the cache_salt among them: the event's
// adapter name (vLLM puts it first in every block's), then, on the first
// block of a sequence (first), one string, the request's cache_salt.
// Anything else (a multimodal identifier, a prompt-embeds hash) makes the
// block's hash one no request's token ids give.
func extraKeyed(ev *Event, i int, first bool) (salt string, ok bool) {
	if ev.Extra == nil {
		return "", true
	}
	e := ev.Extra[i]
	if e.Other {
		return "", false
	}
	s := e.Strings
	if ev.LoraName != "" && len(s) > 0 && s[0] == ev.LoraName {
		s = s[1:]
	}
	switch {
	case len(s) == 0:
		return "", true
	case len(s) == 1 && first:
		return s[0], true
	}
	return "", false
}

// Match returns, per replica, how many leading keys it holds: its longest
// cached prefix in blocks of BlockSize tokens.
func (ix *Index) Match(keys []uint64, replicas []string) []int {
	out := make([]int, len(replicas))
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for i, name := range replicas {
		r := ix.replicas[name]
		if r == nil {
			continue
		}
		n := 0
		for _, k := range keys {
			if r.keys[k] == 0 {
				break
			}
			n++
		}
		out[i] = n
	}
	return out
}

func (ix *Index) newReplica(name string) *replica {
	r := &replica{keys: make(map[uint64]int32), sources: make(map[source]map[BlockHash]*entry), tombs: make(map[tombKey]*tomb),
		primary: -1}
	ix.replicas[name] = r
	return r
}

// maxSpeculative bounds the speculative keys per replica.
const maxSpeculative = 1 << 14

// Speculate records that keys were just routed to the replica: for ttl
// after now they count as held, so a burst of one new prefix is not scattered
// before the engine's events arrive. A replica the index has not heard of
// is created (it may publish later); a full speculative set drops expired
// keys, then everything.
func (ix *Index) Speculate(name string, keys []uint64, now time.Time, ttl time.Duration) {
	if len(keys) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r := ix.replicas[name]
	if r == nil {
		if len(ix.replicas) >= maxTopics {
			return
		}
		r = ix.newReplica(name)
	}
	if r.spec == nil {
		r.spec = make(map[uint64]time.Time)
	}
	if len(r.spec)+len(keys) > maxSpeculative {
		for k, exp := range r.spec {
			if !now.Before(exp) {
				delete(r.spec, k)
			}
		}
		if len(r.spec)+len(keys) > maxSpeculative {
			clear(r.spec)
		}
	}
	for i, k := range keys {
		if i >= maxSpeculative {
			break
		}
		r.spec[k] = now.Add(ttl)
	}
}

// MatchFresh is Match counting speculative keys unexpired at now, and
// telling which replicas had a batch within freshFor before now.
func (ix *Index) MatchFresh(keys []uint64, replicas []string, now time.Time, freshFor time.Duration, matched []int, fresh []bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for i, name := range replicas {
		matched[i], fresh[i] = 0, false
		r := ix.replicas[name]
		if r == nil {
			continue
		}
		fresh[i] = !r.lastEvent.IsZero() && now.Sub(r.lastEvent) <= freshFor
		n := 0
		for _, k := range keys {
			if r.keys[k] == 0 {
				if exp, ok := r.spec[k]; !ok || !now.Before(exp) {
					break
				}
			}
			n++
		}
		matched[i] = n
	}
}

// LastEvent is when the replica's last batch was applied (zero if never).
func (ix *Index) LastEvent(name string) time.Time {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if r := ix.replicas[name]; r != nil {
		return r.lastEvent
	}
	return time.Time{}
}

// Forget drops a replica that left the pool: its blocks and its
// sequences, so if it comes back its next message starts afresh rather
// than showing the gap of what it published while away.
func (ix *Index) Forget(name string) {
	ix.Retain(func(n string) bool { return n != name })
}

// Retain forgets (as Forget) every replica keep says is not the pool's.
func (ix *Index) Retain(keep func(name string) bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for name, r := range ix.replicas {
		if keep(name) {
			continue
		}
		ix.total -= r.n
		ix.totalW -= r.w
		for _, t := range r.tombs {
			ix.unlinkTomb(t)
		}
		delete(ix.replicas, name)
	}
	for sk, st := range ix.seqs {
		if !keep(st.name) {
			delete(ix.seqs, sk)
		}
	}
}

// CountDrop counts a message dropped before it reached the index.
func (ix *Index) CountDrop(r Reason) {
	ix.mu.Lock()
	ix.c.drop(r)
	ix.mu.Unlock()
}

// Apply applies one decoded message from the replica its topic names. A
// sequence gap or a sequence going back (publisher restart) clears that
// replica's cache for the message's rank first: the events in between are
// lost, so what the index held may be stale. (A Listener with replay
// fills a gap from the engine's buffer before it gets here: replay.go.) A message
// with the last sequence again is a duplicate (one that reached this
// instance twice, through the relay too) and is dropped. False: dropped.
func (ix *Index) Apply(name string, m Message, now time.Time) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	rank := m.Batch.DPRank
	sk := seqKey{topic: m.Topic, rank: rank}
	st, seen := ix.seqs[sk]
	last := st.seq
	if !seen {
		// A replica's own topics are bounded: one publisher cycling
		// through ranks filled the whole table, and every replica that
		// came later was dropped. Its own oldest makes room.
		if r := ix.replicas[name]; r != nil && r.topics >= maxSourcesPerReplica {
			ix.evictOwnTopic(name, r)
		} else if len(ix.seqs) >= maxTopics && !ix.evictIdleTopic(now) {
			ix.c.drop(ReasonTooMany)
			return false
		}
	}
	if seen && m.Seq == last {
		ix.c.drop(ReasonDuplicate)
		return false
	}
	r := ix.replicas[name]
	if r == nil {
		r = ix.newReplica(name)
	}
	if seen {
		switch {
		case m.Seq == last+1:
		case m.Seq > last+1:
			ix.c.gaps++
			ix.clearRank(r, rank)
		default:
			ix.c.restarts++
			ix.clearRank(r, rank)
		}
	}
	if !seen {
		r.topics++
	}
	ix.seqs[sk] = seqState{seq: m.Seq, name: name, at: now}
	ix.c.batches++
	ix.c.unknown += uint64(m.Batch.Unknown)
	r.lastEvent = now
	for i := range m.Batch.Events {
		ev := &m.Batch.Events[i]
		src := source{rank: rank, medium: ev.Medium}
		// An event store drops is counted under its drop reason, not here.
		applied := true
		if ev.Kind != AllBlocksCleared {
			g, ok := ix.keyedGroup(r, ev)
			if !ok {
				ix.c.dropEvent(ReasonGroup)
				continue
			}
			src.group = g
		}
		switch ev.Kind {
		case BlockStored:
			applied = ix.store(r, src, ev, now)
		case BlockRemoved:
			blocks := r.sources[src]
			for _, h := range ev.BlockHashes {
				if e := blocks[h]; e != nil && e.copies > 1 {
					e.copies--
				} else if e != nil {
					ix.bury(r, e)
					ix.remove(r, e)
				} else {
					ix.c.removedUnknown++
				}
			}
		case AllBlocksCleared:
			ix.c.cleared++
			ix.clearRank(r, rank)
		}
		if applied {
			ix.c.events++
		}
	}
	return true
}

// evictIdleTopic drops the topic silent longest if it has been for
// topicIdle, to make room for a new one; false if none has. Its rank's
// entries go too (its sequence is forgotten, so a gap would go unseen
// when it comes back), and its replica when nothing is left of it.
func (ix *Index) evictIdleTopic(now time.Time) bool {
	if now.Before(ix.noIdleBefore) {
		return false
	}
	var oldest seqKey
	var st seqState
	found := false
	for k, v := range ix.seqs {
		if !found || v.at.Before(st.at) {
			oldest, st, found = k, v, true
		}
	}
	if !found || now.Sub(st.at) < topicIdle {
		ix.noIdleBefore = st.at.Add(topicIdle)
		return false
	}
	delete(ix.seqs, oldest)
	r := ix.replicas[st.name]
	if r == nil {
		return true
	}
	r.topics--
	ix.clearRank(r, oldest.rank)
	if r.n > 0 {
		return true
	}
	for _, v := range ix.seqs {
		if v.name == st.name {
			return true
		}
	}
	for _, t := range r.tombs {
		ix.unlinkTomb(t)
	}
	delete(ix.replicas, st.name)
	return true
}

// evictOwnTopic drops the replica's topic (and rank) seen longest ago,
// and that rank's entries, as evictIdleTopic does.
func (ix *Index) evictOwnTopic(name string, r *replica) {
	var oldest seqKey
	var at time.Time
	found := false
	for k, v := range ix.seqs {
		if v.name == name && (!found || v.at.Before(at)) {
			oldest, at, found = k, v.at, true
		}
	}
	if !found {
		return
	}
	delete(ix.seqs, oldest)
	r.topics--
	ix.clearRank(r, oldest.rank)
}

// store applies one BlockStored; false: dropped (counted by reason as an
// event, the rest of its message applies), the index unchanged, except
// for extra_keys: the blocks from the first whose extra keys Sluice cannot
// reproduce on are held without keys (their removal and children are
// then known, and the children keyless too), the event counted dropped.
//
// A chain starts at its namespace's root (keys.go): the event's adapter
// and its first block's cache_salt, so an adapter's or a salted request's
// blocks never count for the base model's requests.
func (ix *Index) store(r *replica, src source, ev *Event, now time.Time) bool {
	// Before the source is made: an offloaded block without token ids
	// (see Event), or a sparse one, must not take one of the replica's
	// source slots.
	if ev.Sparse {
		ix.c.dropEvent(ReasonSparse)
		return false
	}
	bs := ev.BlockSize
	if bs <= 0 || len(ev.TokenIDs) != len(ev.BlockHashes)*bs {
		ix.c.dropEvent(ReasonTokenCount)
		return false
	}
	blocks := r.sources[src]
	if blocks == nil {
		if len(r.sources) >= maxSourcesPerReplica {
			ix.c.dropEvent(ReasonTooMany)
			return false
		}
		blocks = make(map[BlockHash]*entry)
		r.sources[src] = blocks
	}
	state, fromRoot := ix.keyer.start(), true
	if ev.Parent != NoHash {
		switch p := blocks[ev.Parent]; {
		case p != nil:
			state, fromRoot = p.state, false
		case ev.Parent == IntHash(0):
			// the sim's positional form says "no parent" with 0
		case len(ev.BlockHashes) > 0 && r.tombs[tombKey{src, ev.BlockHashes[0]}] != nil:
			// the parent is unknown but the first block is known: its keys
			fromRoot = false
		default:
			// evicted here, or stored before we listened: the chain is unknown
			ix.c.dropEvent(ReasonParent)
			return false
		}
	}
	if ev.LoraName != "" {
		ix.adapters.add(ev.LoraName)
	}
	// unkeyed: extra keys Sluice cannot reproduce (counted as such first);
	// byID: an adapter named by lora_id alone.
	unkeyed, byID := false, false
	if fromRoot && len(ev.BlockHashes) > 0 {
		salt, ok := extraKeyed(ev, 0, true)
		state = chain{last: ix.keyer.rootOf(namespace{adapter: adapterOf(ev), salt: SaltTag(salt)}), dead: !ok}
		unkeyed = !ok
	}
	if ev.LoraName == "" && ev.HasLora && ev.LoraID > 0 {
		// An adapter named by lora_id alone (vLLM before lora_name): its
		// requests name it by name, and nothing a router can read maps
		// one to the other (vLLM's /v1/models lists names; the ids come
		// from its API server's counter, spent even by a failed load).
		// Held without keys, as unreproducible extra keys are.
		state.dead, byID = true, true
	}
	for i, h := range ev.BlockHashes {
		if i > 0 || !fromRoot {
			if _, ok := extraKeyed(ev, i, false); !ok {
				state.dead, unkeyed = true, true
			}
		}
		if old := blocks[h]; old != nil {
			// Another copy of a block held (see entry.copies): the same
			// prefix, so the same keys; it is the newest now.
			old.copies++
			state = old.state
			ix.touch(r, old)
			r.countStore(now, false)
			continue
		}
		var keys []uint64
		if t := r.tombs[tombKey{src, h}]; t != nil {
			// Stored again: the keys it had. The next block chains from it.
			keys, state = t.keys, t.state
			ix.unlinkTomb(t)
			ix.c.reStored++
			r.countStore(now, true)
		} else {
			keys, state = ix.keyer.extend(state, ev.TokenIDs[i*bs:(i+1)*bs], nil)
			r.countStore(now, false)
		}
		e := &entry{hash: h, src: src, keys: keys, state: state, copies: 1}
		blocks[h] = e
		for _, k := range keys {
			r.keys[k]++
		}
		e.prev = r.tail
		if r.tail != nil {
			r.tail.next = e
		} else {
			r.head = e
		}
		r.tail = e
		r.n++
		ix.total++
		r.w += weight(keys)
		ix.totalW += weight(keys)
		// Block by block, not after the batch: one batch may carry far
		// more blocks than the bounds (up to the 16 MiB payload).
		ix.enforce(r)
	}
	switch {
	case unkeyed:
		ix.c.dropEvent(ReasonExtraKeys)
		return false
	case byID:
		ix.c.dropEvent(ReasonLoraID)
		return false
	}
	return true
}

// touch makes e the replica's newest entry (the last the bounds drop).
func (ix *Index) touch(r *replica, e *entry) {
	if r.tail == e {
		return
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		r.head = e.next
	}
	e.next.prev = e.prev
	e.prev, e.next = r.tail, nil
	r.tail.next = e
	r.tail = e
}

func (ix *Index) remove(r *replica, e *entry) {
	for _, k := range e.keys {
		if r.keys[k]--; r.keys[k] <= 0 {
			delete(r.keys, k)
		}
	}
	// An emptied source map stays (bounded by maxSourcesPerReplica): store
	// may be filling it while it removes a block it replaces.
	if blocks := r.sources[e.src]; blocks != nil {
		delete(blocks, e.hash)
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		r.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		r.tail = e.prev
	}
	e.prev, e.next = nil, nil
	r.n--
	ix.total--
	r.w -= weight(e.keys)
	ix.totalW -= weight(e.keys)
}

// bury remembers a block the engine removed (see tomb), dropping the
// oldest remembered ones beyond maxTombs.
func (ix *Index) bury(r *replica, e *entry) {
	k := tombKey{e.src, e.hash}
	if old := r.tombs[k]; old != nil {
		ix.unlinkTomb(old)
	}
	t := &tomb{r: r, key: k, keys: e.keys, state: e.state, prev: ix.tombTail}
	if ix.tombTail != nil {
		ix.tombTail.next = t
	} else {
		ix.tombHead = t
	}
	ix.tombTail = t
	r.tombs[k] = t
	ix.tombs += weight(t.keys)
	for ix.tombs > ix.maxTombs() {
		ix.unlinkTomb(ix.tombHead)
	}
}

func (ix *Index) unlinkTomb(t *tomb) {
	delete(t.r.tombs, t.key)
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		ix.tombHead = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		ix.tombTail = t.prev
	}
	t.prev, t.next = nil, nil
	ix.tombs -= weight(t.keys)
}

// clearRank drops every block of one data-parallel rank, all media.
func (ix *Index) clearRank(r *replica, rank int) {
	ix.dropSources(r, func(src source) bool { return src.rank == rank })
}

// dropSources drops every block of the replica's sources that match.
func (ix *Index) dropSources(r *replica, match func(source) bool) {
	for src, blocks := range r.sources {
		if !match(src) {
			continue
		}
		for _, e := range blocks {
			ix.remove(r, e)
		}
		delete(r.sources, src)
	}
}

// enforce applies the size bounds, oldest first, counting what it drops.
func (ix *Index) enforce(r *replica) {
	for r.w > ix.cfg.MaxBlocksPerReplica {
		ix.remove(r, r.head)
		ix.c.capacityEvicted++
	}
	for ix.totalW > ix.cfg.MaxBlocksTotal {
		var largest *replica
		for _, o := range ix.replicas {
			if largest == nil || o.w > largest.w {
				largest = o
			}
		}
		ix.remove(largest, largest.head)
		ix.c.capacityEvicted++
	}
}
