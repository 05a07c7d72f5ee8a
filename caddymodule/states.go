package caddymodule

import (
	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/qll"
)

// qllStates holds one queued_least_latency state per pool. A usage pool
// counts references: the config being loaded takes its reference before
// the old config drops its own, so a reload never destroys the state (nor
// the requests waiting in it); the state is closed when no config uses
// the pool any more.
var qllStates = caddy.NewUsagePool()

type poolState struct {
	*qll.State
	unwatch func()
}

func newPoolState(name string, cfg qll.Config) *poolState {
	s := qll.New(cfg)
	s.SetWaitObserver(qllCollector.WaitObserver(name))
	// A managed pool (set-backends, admin API, restored file) drives the
	// state's backend set; an unmanaged one is synced from reverse_proxy's
	// own upstreams on each request.
	unwatch := lb.GetPool(name).Watch(func(set []lb.Backend, managed bool) {
		if managed {
			s.SetBackends(lb.Dials(set))
		}
	})
	return &poolState{State: s, unwatch: unwatch}
}

// Destruct implements caddy.Destructor.
func (ps *poolState) Destruct() error {
	ps.unwatch()
	ps.Close()
	return nil
}

// usageLookup returns the live value stored under key in p without
// taking a reference (health and metrics only look), or nil.
func usageLookup(p *caddy.UsagePool, key string) any {
	var found any
	p.Range(func(k, v any) bool {
		if k == key {
			found = v
			return false
		}
		return true
	})
	return found
}

// usageByPool maps every live value of a pool-keyed usage pool through get.
func usageByPool[T any](p *caddy.UsagePool, get func(v any) T) map[string]T {
	out := map[string]T{}
	p.Range(func(k, v any) bool {
		out[k.(string)] = get(v)
		return true
	})
	return out
}

// qllStateFor returns the live state of a pool, or nil if no loaded config
// uses queued_least_latency on it.
func qllStateFor(name string) *qll.State {
	if v, ok := usageLookup(qllStates, name).(*poolState); ok {
		return v.State
	}
	return nil
}

// qllStatesByPool lists every live state, for the metrics collector.
func qllStatesByPool() map[string]*qll.State {
	return usageByPool(qllStates, func(v any) *qll.State { return v.(*poolState).State })
}
