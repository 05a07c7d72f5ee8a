package caddymodule

import (
	"errors"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
)

// State that outlives a config reload (queues, EWMAs, trees, counters,
// Redis connections, flow-control queues) lives in one registry, keyed by
// the module that owns it and the pool it serves. It is reference
// counted: the config being loaded takes its reference before the old
// config drops its own, so a reload never destroys the state nor the
// requests waiting in it; the state is destroyed when no config uses it.
var sharedStates = caddy.NewUsagePool()

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
	v, _, err := sharedStates.LoadOrNew(key, func() (caddy.Destructor, error) { return build() })
	if err != nil {
		return nil, err
	}
	c.keys = append(c.keys, key)
	return v.(sharedState), nil
}

// release drops every reference taken, once.
func (c *stateClaims) release() error {
	var errs []error
	for _, k := range c.keys {
		if _, err := sharedStates.Delete(k); err != nil {
			errs = append(errs, err)
		}
	}
	c.keys = nil
	return errors.Join(errs...)
}

// liveStatesOf maps every module serving pool to its live state (the
// first one when the module has several variants on the pool), without
// taking a reference: health only looks.
func liveStatesOf(pool string) map[string]sharedState {
	out := map[string]sharedState{}
	sharedStates.Range(func(k, v any) bool {
		key := k.(stateKey)
		if _, seen := out[key.module]; key.pool == pool && !seen {
			out[key.module] = v.(sharedState)
		}
		return true
	})
	return out
}

// liveStates maps every pool to its live state of module (the first one
// when a pool has several variants).
func liveStates(module string) map[string]sharedState {
	out := map[string]sharedState{}
	sharedStates.Range(func(k, v any) bool {
		key := k.(stateKey)
		if _, seen := out[key.pool]; key.module == module && !seen {
			out[key.pool] = v.(sharedState)
		}
		return true
	})
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
