package caddymodule

import (
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
)

// proxyView is Caddy's health view of a pool's upstreams for a picker
// that holds requests (lb.ProxyViewer): it keeps the upstream list of
// the latest request through the state, whose hosts' health and request
// counts Caddy keeps current, so a waiting request sees a replica come
// back (or go down) without a new request bringing the news.
type proxyView struct {
	mu   sync.Mutex
	pool reverseproxy.UpstreamPool
}

// newProxyView hands pk a view when it takes one; nil otherwise.
func newProxyView(pk lb.Picker) *proxyView {
	pv, ok := pk.(lb.ProxyViewer)
	if !ok {
		return nil
	}
	v := &proxyView{}
	pv.SetProxyView(v.read)
	return v
}

// remember makes pool the upstreams the view reads.
func (v *proxyView) remember(pool reverseproxy.UpstreamPool) {
	v.mu.Lock()
	v.pool = pool
	v.mu.Unlock()
}

// read lists the upstreams Caddy would not use now and, of those, the
// ones only full (see unavailable).
func (v *proxyView) read() (down, full []string) {
	v.mu.Lock()
	pool := v.pool
	v.mu.Unlock()
	return unavailable(pool, nil, nil)
}
