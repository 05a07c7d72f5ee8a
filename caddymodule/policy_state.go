package caddymodule

import (
	"context"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
)

// policyState is a selection policy's shared state for one pool: its
// picker, fed with the pool's backend set, and the picker's background
// loops.
type policyState struct {
	key      stateKey
	picker   lb.Picker
	settings func() any
	closer   func()
	// extra is the policy's own companion state (e.g. a log loop).
	extra any
	// firstByte learns each replica's usual time to first byte.
	firstByte firstByteStats

	static staticSync
	life   lifecycle
}

// backendSetter is implemented by pickers that need more than the dial
// address of each replica (e.g. the URL to scrape its metrics).
type backendSetter interface {
	SetBackends([]lb.Backend)
}

// newPolicyState wraps pk: run (if any) runs until the state is
// destroyed, closer (if any) runs then; a managed backend set (set-backends,
// admin API, restored file) drives the replicas, otherwise reverse_proxy's
// own upstream list does (syncStatic on each request).
func newPolicyState(key stateKey, pk lb.Picker, settings func() any, run func(context.Context), closer func()) *policyState {
	st := &policyState{key: key, picker: pk, settings: settings, closer: closer}
	st.life.begin(key.pool, func(set []lb.Backend, managed bool) {
		if managed {
			st.setBackends(set)
		}
	}, run)
	return st
}

func (st *policyState) setBackends(set []lb.Backend) {
	if bs, ok := st.picker.(backendSetter); ok {
		bs.SetBackends(set)
		return
	}
	st.picker.SetReplicas(lb.Dials(set))
}

// syncStatic makes reverse_proxy's own upstream list the replica set, for
// pools without a managed set.
func (st *policyState) syncStatic(pool reverseproxy.UpstreamPool) {
	st.static.sync(pool, st.setBackends)
}

// Settings implements sharedState.
func (st *policyState) Settings() any { return st.settings() }

// Destruct implements caddy.Destructor.
func (st *policyState) Destruct() error {
	st.life.end()
	if st.closer != nil {
		st.closer()
	}
	return nil
}
