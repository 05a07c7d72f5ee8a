package lb

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Pool is a named backend set, shared by every Sluice module that names it
// and kept for the life of the process, so a config reload never loses the
// set the platform last posted.
type Pool struct {
	name string

	// setMu serialises Set so subscribers see updates in the order they
	// were made; mu guards the fields below and is never held while
	// calling subscribers.
	setMu   sync.Mutex
	mu      sync.Mutex
	set     []Backend
	managed bool
	// isManaged mirrors managed for Managed, asked on every request: a
	// load, where the mutex was shared by every request of the pool.
	isManaged atomic.Bool
	version   uint64
	nextSub   int
	subs      map[int]func([]Backend)
}

var (
	poolsMu sync.Mutex
	pools   = map[string]*Pool{}
)

// DefaultPool is the pool used when a config names none.
const DefaultPool = "default"

// GetPool returns the pool called name, creating an empty, unmanaged one
// on first use.
func GetPool(name string) *Pool {
	if name == "" {
		name = DefaultPool
	}
	poolsMu.Lock()
	defer poolsMu.Unlock()
	p, ok := pools[name]
	if !ok {
		p = &Pool{name: name, subs: map[int]func([]Backend){}}
		pools[name] = p
	}
	return p
}

// LookupPool returns the pool called name if it exists; unlike GetPool it
// creates none (a read of outside input, such as an admin path, must not
// leave a pool behind).
func LookupPool(name string) (*Pool, bool) {
	if name == "" {
		name = DefaultPool
	}
	poolsMu.Lock()
	defer poolsMu.Unlock()
	p, ok := pools[name]
	return p, ok
}

// PoolNames lists the pools that exist, sorted.
func PoolNames() []string {
	poolsMu.Lock()
	defer poolsMu.Unlock()
	names := make([]string, 0, len(pools))
	for n := range pools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.name }

// Backends returns a copy of the current set, and whether the set is
// managed (given by set-backends, the admin API or a restore) rather than
// never set.
func (p *Pool) Backends() ([]Backend, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Backend(nil), p.set...), p.managed
}

// Managed reports whether a set was ever given to this pool.
func (p *Pool) Managed() bool { return p.isManaged.Load() }

// Version increases on every Set.
func (p *Pool) Version() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.version
}

// Set replaces the backend set (already validated by ParseBackends) and
// tells every subscriber, in order. It returns the dial addresses added
// and removed.
func (p *Pool) Set(bs []Backend) (added, removed []string) {
	p.setMu.Lock()
	defer p.setMu.Unlock()

	p.mu.Lock()
	old := make(map[string]bool, len(p.set))
	for _, b := range p.set {
		old[b.Dial] = true
	}
	next := make(map[string]bool, len(bs))
	for _, b := range bs {
		next[b.Dial] = true
		if !old[b.Dial] {
			added = append(added, b.Dial)
		}
	}
	for _, b := range p.set {
		if !next[b.Dial] {
			removed = append(removed, b.Dial)
		}
	}
	p.set = append([]Backend(nil), bs...)
	p.managed = true
	p.isManaged.Store(true)
	p.version++
	subs := make([]func([]Backend), 0, len(p.subs))
	ids := make([]int, 0, len(p.subs))
	for id := range p.subs {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		subs = append(subs, p.subs[id])
	}
	snapshot := append([]Backend(nil), bs...)
	p.mu.Unlock()

	for _, fn := range subs {
		fn(snapshot)
	}
	return added, removed
}

// Watch calls fn with the current set (and whether it is managed) at once,
// then with the new set after every Set, until the returned cancel function
// is called. Holding setMu while subscribing means no Set can slip between
// the first call and the subscription. fn must not call Set.
func (p *Pool) Watch(fn func(set []Backend, managed bool)) (cancel func()) {
	p.setMu.Lock()
	defer p.setMu.Unlock()
	set, managed := p.Backends()
	fn(set, managed)
	return p.subscribe(func(bs []Backend) { fn(bs, true) })
}

func (p *Pool) subscribe(fn func([]Backend)) (cancel func()) {
	p.mu.Lock()
	id := p.nextSub
	p.nextSub++
	p.subs[id] = fn
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.subs, id)
		p.mu.Unlock()
	}
}
