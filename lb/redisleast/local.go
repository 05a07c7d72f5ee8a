package redisleast

import (
	"sync"
	"sync/atomic"
)

// localCounts is this instance's own in-flight count per replica, Redis
// and fallback leases alike: the best view left when Redis is down.
type localCounts struct {
	mu sync.RWMutex
	m  map[string]*atomic.Int64
}

func (l *localCounts) get(addr string) *atomic.Int64 {
	l.mu.RLock()
	c := l.m[addr]
	l.mu.RUnlock()
	if c != nil {
		return c
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*atomic.Int64{}
	}
	if c = l.m[addr]; c == nil {
		c = new(atomic.Int64)
		l.m[addr] = c
	}
	return c
}

// least returns the candidate with the fewest local requests, scanning
// from off so ties rotate.
func (l *localCounts) least(cands []string, off int) (string, int64) {
	best, bestN := "", int64(-1)
	for i := range cands {
		a := cands[(i+off)%len(cands)]
		n := l.get(a).Load()
		if bestN < 0 || n < bestN {
			best, bestN = a, n
		}
	}
	return best, bestN
}

// retain forgets idle replicas that left the set.
func (l *localCounts) retain(addrs []string) {
	keep := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		keep[a] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for a, c := range l.m {
		if !keep[a] && c.Load() == 0 {
			delete(l.m, a)
		}
	}
}

// snapshot is the replicas with requests in flight, and their counts.
func (l *localCounts) snapshot() map[string]int {
	out := map[string]int{}
	l.mu.RLock()
	defer l.mu.RUnlock()
	for a, c := range l.m {
		if n := c.Load(); n > 0 {
			out[a] = int(n)
		}
	}
	return out
}
