package cacheaware

import "github.com/sluice-router/sluice/lb"

// CapacityFunc gives a present replica's engine KV cache size in tokens
// and whether it is known (false, or a size of 0: not known).
type CapacityFunc func(addr string) (tokens int, known bool)

// Capacity is a source of the replicas' KV cache sizes (the engines'
// metrics: vLLM's cache_config_info, SGLang's max_total_num_tokens). It
// must be quick: Tokens is called under the router's read lock.
type Capacity interface {
	Tokens(addr string) (tokens int, known bool)
}

// backendsFollower is a Capacity that needs the replica set (a scraper
// reads each replica's metrics at its URL).
type backendsFollower interface {
	SetBackends([]lb.Backend)
}

// SetCapacity sets (nil: clears) the source of the replicas' KV cache
// sizes; a source that follows the set gets the current one at once.
func (p *Picker) SetCapacity(c Capacity) {
	p.setMu.Lock()
	defer p.setMu.Unlock()
	if c == nil {
		p.capacity.Store(nil)
		return
	}
	p.capacity.Store(&c)
	if f, ok := c.(backendsFollower); ok && p.backends != nil {
		f.SetBackends(p.backends)
	}
}

// SetBackends makes set the replicas (as SetReplicas with its dial
// addresses) and gives it to the capacity source, if that follows it.
func (p *Picker) SetBackends(set []lb.Backend) {
	p.setMu.Lock()
	defer p.setMu.Unlock()
	p.setReplicasLocked(lb.Dials(set))
	p.backends = set
	if c := p.capacity.Load(); c != nil {
		if f, ok := (*c).(backendsFollower); ok {
			f.SetBackends(set)
		}
	}
}

// capacityFunc is the capacity source's Tokens (nil: none).
func (p *Picker) capacityFunc() CapacityFunc {
	if c := p.capacity.Load(); c != nil {
		return (*c).Tokens
	}
	return nil
}

// roomKeys orders a miss's candidates by tree chars per token of their
// engine's KV cache (proportional fill): with caches of several sizes,
// new prefixes then fill the big ones as much as the small ones instead
// of spreading evenly and overfilling the small. It returns each usable
// replica's key at its index (in buf when it is long enough), each size
// read once, and false (the smallest tree) unless every usable replica's
// size is known: one unknown size would have to be guessed.
func roomKeys(usable []*replica, capacity CapacityFunc, buf []int, n int) ([]int, bool) {
	if capacity == nil {
		return nil, false
	}
	keys := buf[:0]
	if cap(keys) < n {
		keys = make([]int, 0, n)
	}
	keys = keys[:n]
	for _, rep := range usable {
		size, ok := capacity(rep.addr)
		if !ok || size <= 0 {
			return nil, false
		}
		// Fixed point, 2⁻²⁰ char per token (a cache of millions of
		// tokens holds a tree of thousands of chars early on); bounded
		// so a huge tree cannot overflow (only the keys' order matters).
		keys[rep.idx] = int(min(float64(rep.chars)*(1<<20)/float64(size), 1<<30))
	}
	return keys, true
}
