package sim

import (
	"hash/maphash"
	"sync"

	"github.com/sluice-router/sluice/lb/reqtext"
)

// The prefix cache models vLLM's automatic prefix caching on a text
// approximation of the prompt.
//
// The prompt text (promptText: the router's rendering) is cut into consecutive blocks of
// BlockChars characters; only full blocks are cached. Block i's key is a
// hash of the whole text from the start to the end of block i, so a block
// matches only if everything before it matches too. A request's cached
// prefix is the longest run of leading blocks whose keys are in the cache.
//
// Blocks are kept in LRU order. When a request's blocks are stored they are
// touched from the last to the first, so the first blocks of a prompt (the
// ones other prompts are most likely to share) are the most recently used,
// and eviction takes the tail of a prompt before its head, as vLLM's free
// block queue does.

// prefixSeed keys the block hashes; it is per process, which is all a
// simulated cache needs.
var prefixSeed = maphash.MakeSeed()

// promptPrefix is what the prefix cache needs of one request: the keys of
// its full blocks (at most the cache capacity; later blocks could never
// hit), the number of full blocks and the length of the prompt text.
type promptPrefix struct {
	keys       []uint64
	fullBlocks int
	textLen    int
}

// newPromptPrefix hashes the full blocks of text.
func newPromptPrefix(text []byte, blockChars, capacity int) promptPrefix {
	p := promptPrefix{textLen: len(text), fullBlocks: len(text) / blockChars}
	n := min(p.fullBlocks, capacity)
	if n == 0 {
		return p
	}
	p.keys = make([]uint64, n)
	var h maphash.Hash
	h.SetSeed(prefixSeed)
	for i := range n {
		_, _ = h.Write(text[i*blockChars : (i+1)*blockChars])
		p.keys[i] = h.Sum64() // Sum64 does not reset: the hash covers text[:(i+1)*blockChars]
	}
	return p
}

// cachedTokens converts hit blocks into prompt tokens: the cached share of
// the text, applied to the request's prompt tokens, and at most
// promptTokens−1 (like vLLM, the last prompt token is always computed, to
// get the logits of the first output token).
func (p promptPrefix) cachedTokens(hitBlocks, blockChars, promptTokens int) int {
	if hitBlocks == 0 || p.textLen == 0 {
		return 0
	}
	t := int(int64(promptTokens) * int64(hitBlocks*blockChars) / int64(p.textLen))
	return max(0, min(t, promptTokens-1))
}

// prefixCache is an LRU set of block keys with a fixed capacity. Nodes are
// reused on eviction, so a full cache allocates nothing.
type prefixCache struct {
	blockChars int

	mu       sync.Mutex
	capacity int
	nodes    map[uint64]*prefixNode
	lru      prefixNode // sentinel of a circular list; lru.next is the most recent

	// Counters, in tokens (vLLM's units) and in blocks.
	queryTokens, hitTokens uint64
	queryBlocks, hitBlocks uint64
}

type prefixNode struct {
	key        uint64
	prev, next *prefixNode
}

func newPrefixCache(blocks, blockChars int) *prefixCache {
	c := &prefixCache{
		blockChars: blockChars,
		capacity:   blocks,
		nodes:      make(map[uint64]*prefixNode, min(blocks, 1<<16)),
	}
	c.lru.prev, c.lru.next = &c.lru, &c.lru
	return c
}

// unlink takes n out of the list; it is a no-op if n is not in it (a
// prompt whose keys repeat, which takes a 64-bit hash collision).
func (c *prefixCache) unlink(n *prefixNode) {
	if n.prev == nil {
		return
	}
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (c *prefixCache) pushFront(n *prefixNode) {
	n.prev, n.next = &c.lru, c.lru.next
	c.lru.next.prev = n
	c.lru.next = n
}

// lookup returns the number of leading blocks of p that are cached and
// counts the query (promptTokens of the request; cached, its cached tokens).
// It does not change the LRU order: blocks are touched when stored.
func (c *prefixCache) lookup(p promptPrefix, promptTokens int) (hitBlocks, cached int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range p.keys {
		if _, ok := c.nodes[k]; !ok {
			break
		}
		hitBlocks++
	}
	cached = p.cachedTokens(hitBlocks, c.blockChars, promptTokens)
	c.queryTokens += uint64(promptTokens)
	c.hitTokens += uint64(cached)
	c.queryBlocks += uint64(p.fullBlocks)
	c.hitBlocks += uint64(hitBlocks)
	return hitBlocks, cached
}

// store inserts or touches all of p's blocks (at most the capacity), the
// first block ending up the most recently used, evicting the least recently
// used blocks of other prompts as needed.
func (c *prefixCache) store(p promptPrefix) {
	if len(p.keys) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Take p's cached blocks out of the list first so that making room for
	// its new blocks never evicts one of its own.
	for _, k := range p.keys {
		if n, ok := c.nodes[k]; ok {
			c.unlink(n)
		}
	}
	for i := len(p.keys) - 1; i >= 0; i-- {
		k := p.keys[i]
		n, ok := c.nodes[k]
		if !ok {
			if len(c.nodes) >= c.capacity {
				// len(p.keys) <= capacity and this key is missing, so the list
				// holds at least one block of another prompt.
				n = c.lru.prev
				c.unlink(n)
				delete(c.nodes, n.key)
			} else {
				n = new(prefixNode)
			}
			n.key = k
			c.nodes[k] = n
		} else {
			c.unlink(n)
		}
		c.pushFront(n)
	}
}

// prefixCacheStats is a consistent snapshot of the cache's counters.
type prefixCacheStats struct {
	queryTokens, hitTokens, queryBlocks, hitBlocks uint64
	blocks                                         int
}

func (c *prefixCache) stats() prefixCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return prefixCacheStats{
		queryTokens: c.queryTokens, hitTokens: c.hitTokens,
		queryBlocks: c.queryBlocks, hitBlocks: c.hitBlocks,
		blocks: len(c.nodes),
	}
}

// promptText is the prompt text the prefix cache hashes: the router's
// rendering (lb/reqtext's Text), so that the router and the replica see
// the same prefixes: a chat's media parts as digests of the part (two
// images are two prompts), its other text-like parts, tool calls and
// names; token ids apart from any text. A body the router cannot read
// (which it routes by load alone) has none, nor has a path it does not
// know. Like the router's, the text stops at reqtext.MaxTextBytes.
func promptText(path string, body []byte) []byte {
	req, err := reqtext.Extract(path, body)
	if err != nil {
		return nil
	}
	return []byte(req.Text)
}
