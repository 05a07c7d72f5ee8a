package caddymodule

import (
	"context"
	"crypto/tls"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/loadaware"
	"github.com/sluice-router/sluice/lb/qll"
)

// policyState is a selection policy's shared state for one pool: its
// picker, fed with the pool's backend set, and what the policy's adapter
// added (policyParts).
type policyState struct {
	key    stateKey
	picker lb.Picker
	policyParts
	// firstByte learns each replica's usual time to first byte.
	firstByte firstByteStats
	// view is Caddy's health view for a picker that holds requests (nil
	// for the others).
	view *proxyView

	static staticSync
	life   lifecycle
	// requests counts the Selects running on the state (queued ones
	// included): with its in-flight leases, what it must serve before it
	// is destroyed (state_drain.go).
	requests requestGauge
}

// policyParts are what a policy's adapter gives its shared state besides
// the picker. Only settings is required.
type policyParts struct {
	// settings is the configuration the state runs with now.
	settings func() any
	// health is what the state knows of the pool's replicas (default: the
	// picker's in-flight counts).
	health func() stateHealth
	// run, if set, runs until the state is destroyed; closer, if set,
	// runs then.
	run    func(context.Context)
	closer func()
	// extra is the policy's own companion state (e.g. a log loop, the
	// sharing of a tree).
	extra any
	// setTLS, if set, gives the state's engine reads that its picker's
	// config does not reach (cache_aware's kv_events: KV cache size
	// scrapes, /tokenize) the enclosing proxy's TLS config when a config
	// starts.
	setTLS func(*tls.Config)
}

// backendSetter is implemented by pickers that need more than the dial
// address of each replica (e.g. the URL to scrape its metrics).
type backendSetter interface {
	SetBackends([]lb.Backend)
}

// The policies that read engine metrics get each replica's URL (an
// https:// replica is scraped over TLS).
var (
	_ backendSetter = (*qll.State)(nil)
	_ backendSetter = (*loadaware.Picker)(nil)
)

// newPolicyState wraps pk: a managed backend set (set-backends, admin
// API, restored file) drives the replicas, otherwise reverse_proxy's own
// upstream list does (syncStatic on each request).
func newPolicyState(key stateKey, pk lb.Picker, parts policyParts) *policyState {
	st := &policyState{key: key, picker: pk, policyParts: parts, view: newProxyView(pk)}
	st.life.begin(key.pool, func(set []lb.Backend, managed bool) {
		if managed {
			st.setBackends(set)
		}
	}, parts.run)
	return st
}

func (st *policyState) setBackends(set []lb.Backend) {
	if bs, ok := st.picker.(backendSetter); ok {
		bs.SetBackends(set)
	} else {
		st.picker.SetReplicas(lb.Dials(set))
	}
	st.firstByte.keepOnly(set)
}

// syncStatic makes reverse_proxy's own upstream list the replica set, for
// pools without a managed set.
func (st *policyState) syncStatic(pool reverseproxy.UpstreamPool, scheme upstreamScheme) {
	st.static.sync(pool, scheme, st.setBackends)
}

// Settings implements observable.
func (st *policyState) Settings() any { return st.settings() }

// Health implements observable.
func (st *policyState) Health() stateHealth {
	if st.health != nil {
		return st.health()
	}
	return inFlightHealth(st.picker.InFlight())
}

// Destruct implements caddy.Destructor: once no config uses the state,
// it is destroyed when its requests have ended (state_drain.go).
func (st *policyState) Destruct() error {
	destroyWhenIdle(st.key, func() bool { return st.requests.idle() && totalInFlight(st.picker.InFlight()) == 0 }, func() {
		st.life.end()
		if st.closer != nil {
			st.closer()
		}
	})
	return nil
}
