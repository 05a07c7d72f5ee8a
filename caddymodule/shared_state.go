package caddymodule

import (
	"cmp"
	"errors"
	"slices"
	"sync"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
)

// State that outlives a config reload (queues, EWMAs, trees, counters,
// Redis connections, flow-control queues) lives in one registry, keyed by
// the module that owns it and the pool it serves. It is reference
// counted: the config being loaded takes its reference before the old
// config drops its own, so a reload never destroys the state nor the
// requests waiting in it; the state is destroyed when no config uses it.
var sharedStates = &stateRegistry{pool: caddy.NewUsagePool(), built: map[stateKey]*registered{}}

// stateRegistry is a caddy.UsagePool (references, construction once) with
// an index of the states fully built, which is all that readers (health,
// metrics) see: UsagePool.Range waits on an entry until it is built, and a
// build may wait seconds on a Redis that does not answer.
type stateRegistry struct {
	pool  *caddy.UsagePool
	mu    sync.RWMutex
	built map[stateKey]*registered
}

// registered is what the usage pool holds for a key: the state, indexed
// from the end of its build until its destruction.
type registered struct {
	reg *stateRegistry
	key stateKey
	st  sharedState
}

// Destruct implements caddy.Destructor: the usage pool calls it once the
// last reference is dropped.
func (r *registered) Destruct() error {
	r.reg.mu.Lock()
	if r.reg.built[r.key] == r { // not a newer state built since under the same key
		delete(r.reg.built, r.key)
	}
	r.reg.mu.Unlock()
	return r.st.Destruct()
}

func (s *stateRegistry) loadOrNew(key stateKey, build func() (sharedState, error)) (sharedState, error) {
	v, _, err := s.pool.LoadOrNew(key, func() (caddy.Destructor, error) {
		st, err := build()
		if err != nil {
			return nil, err
		}
		r := &registered{reg: s, key: key, st: st}
		s.mu.Lock()
		s.built[key] = r
		s.mu.Unlock()
		return r, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*registered).st, nil
}

// visible lists the built states, ordered by module, pool, then the
// preferred first: the running config's (the one whose settings are in
// force), another running config's (the old one, during a reload), then
// by variant. While a config runs, a state none of the running configs
// registered is left out: it belongs to a config still being provisioned,
// or one Caddy is refusing. Without a running config (before the first
// starts, or modules provisioned on their own) every built state shows.
func (s *stateRegistry) visible() []*registered {
	s.mu.RLock()
	all := make([]*registered, 0, len(s.built))
	for _, r := range s.built {
		all = append(all, r)
	}
	s.mu.RUnlock()
	ranks, configured := runningKeys()
	rank := func(k stateKey) int {
		if r, ok := ranks[k]; ok {
			return r
		}
		return 2
	}
	if configured {
		all = slices.DeleteFunc(all, func(r *registered) bool { return rank(r.key) == 2 })
	}
	slices.SortFunc(all, func(a, b *registered) int {
		return cmp.Or(cmp.Compare(a.key.module, b.key.module), cmp.Compare(a.key.pool, b.key.pool),
			cmp.Compare(rank(a.key), rank(b.key)), cmp.Compare(a.key.variant, b.key.variant))
	})
	return all
}

// runningKeys ranks the keys the running configs registered settings for
// (applyOnStart): 0 for the config in force, 1 for an older one still
// running; configured reports whether any config runs.
func runningKeys() (ranks map[stateKey]int, configured bool) {
	appsMu.Lock()
	cur, apps := applied, slices.Clone(running)
	appsMu.Unlock()
	if cur == nil && len(apps) == 0 {
		return nil, false
	}
	ranks = map[stateKey]int{}
	for _, a := range apps {
		if a != cur {
			for _, k := range a.keys() {
				ranks[k] = 1
			}
		}
	}
	if cur != nil {
		for _, k := range cur.keys() {
			ranks[k] = 0
		}
	}
	return ranks, true
}

// keys are the state keys a config registered settings for.
func (a *App) keys() []stateKey {
	a.mu.Lock()
	defer a.mu.Unlock()
	ks := make([]stateKey, len(a.pending))
	for i, p := range a.pending {
		ks[i] = p.key
	}
	return ks
}

// stateKey names one shared state. Variant separates states of one module
// and pool that cannot be one (e.g. two Redis connections).
type stateKey struct {
	module, pool, variant string
}

// sharedState is what the registry holds.
type sharedState interface {
	caddy.Destructor
	observable
}

// observable is how a module's shared state describes itself to the
// health report, which calls it for every live state of a pool without
// naming any module. (Metrics are the other half: each module registers
// its collectors, which read its live states, from its own file; see
// registerCollectors.) So adding a module touches its own adapter file and
// its lb package, not health or metrics.
type observable interface {
	// Settings is the configuration the state runs with now.
	Settings() any
	// Health is what the state knows of its pool's replicas now.
	Health() stateHealth
}

// stateClaims records what one module instance took from the registry so
// that its Cleanup releases exactly that: nothing when Provision failed
// before taking anything, which is what keeps a refused config from
// dropping the running config's reference.
type stateClaims struct {
	keys []stateKey
}

// take returns the live state under key, building it on first use, and
// records the instance's reference. Call it last in Provision: nothing
// after it may fail.
func (c *stateClaims) take(key stateKey, build func() (sharedState, error)) (sharedState, error) {
	st, err := sharedStates.loadOrNew(key, build)
	if err != nil {
		return nil, err
	}
	c.keys = append(c.keys, key)
	return st, nil
}

// release drops every reference taken, once.
func (c *stateClaims) release() error {
	var errs []error
	for _, k := range c.keys {
		if _, err := sharedStates.pool.Delete(k); err != nil {
			errs = append(errs, err)
		}
	}
	c.keys = nil
	return errors.Join(errs...)
}

// liveStatesOf maps every module serving pool to its live state, without
// taking a reference: health only looks. Of several states of a module on
// the pool (variants), the preferred one (see visible).
func liveStatesOf(pool string) map[string]sharedState {
	out := map[string]sharedState{}
	for _, r := range sharedStates.visible() {
		if _, seen := out[r.key.module]; r.key.pool == pool && !seen {
			out[r.key.module] = r.st
		}
	}
	return out
}

// liveStates maps every pool to its live state of module (the preferred
// one when a pool has several variants).
func liveStates(module string) map[string]sharedState {
	out := map[string]sharedState{}
	for _, r := range sharedStates.visible() {
		if _, seen := out[r.key.pool]; r.key.module == module && !seen {
			out[r.key.pool] = r.st
		}
	}
	return out
}

// pickersOf lists the live picker of a policy module per pool.
func pickersOf[T lb.Picker](module string) map[string]T {
	out := map[string]T{}
	for pool, st := range liveStates(module) {
		if pk, ok := st.(*policyState).picker.(T); ok {
			out[pool] = pk
		}
	}
	return out
}

// mapped applies f to every value of m.
func mapped[A, B any](m map[string]A, f func(A) B) map[string]B {
	out := make(map[string]B, len(m))
	for k, v := range m {
		out[k] = f(v)
	}
	return out
}
