package caddymodule

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// A pool is one set of replicas. Without a managed backend set, a Sluice
// policy takes its pool's replicas from the upstream list of the request
// it picks for (selector.go), so two reverse_proxy handlers that give one
// pool different lists would swap its replica set on every request, and
// a request queued by one could be sent to the other's upstream, with its
// headers. The config is refused instead, naming the pool and both
// sources; handlers that take the pool's backend set (dynamic
// custom_router <pool>) share it by design.
//
// The check runs while the config is provisioned, not when it starts:
// each Sluice policy records its reverse_proxy's source in the config's
// sluice app, and the second handler that disagrees fails its Provision.
// So `caddy validate` refuses the config too, and a refused reload starts
// none of its apps (no listener of it is ever bound).

// poolSource is where one reverse_proxy handler's upstreams come from.
type poolSource struct {
	static  []string // static upstreams' dial addresses, sorted
	set     string   // dynamic custom_router: the pool whose backend set it returns
	dynamic string   // another dynamic source: its module
}

func (s poolSource) String() string {
	switch {
	case s.set != "":
		return "dynamic custom_router " + s.set
	case s.dynamic != "":
		return "dynamic " + s.dynamic
	case len(s.static) == 0:
		return "no upstreams"
	}
	return "upstreams " + strings.Join(s.static, " ")
}

// agrees reports whether requests through s and t would give their pool
// the same replicas: the same static upstreams (in any order), or the
// same pool's backend set. Another dynamic source's list is not known
// before a request, so it agrees with nothing.
func (s poolSource) agrees(t poolSource) bool {
	switch {
	case s.dynamic != "" || t.dynamic != "":
		return false
	case s.set != "" || t.set != "":
		return s.set == t.set
	}
	return slices.Equal(s.static, t.static)
}

// poolClaim is the first source a config gave a pool, and the handler
// that gave it.
type poolClaim struct {
	src   poolSource
	proxy *reverseproxy.Handler
}

// sourceOf is where h's upstreams come from. It runs while h provisions
// its selection policy: its static upstreams are decoded, its dynamic
// source (loaded after the policy) is usually still raw JSON.
func sourceOf(h *reverseproxy.Handler) (poolSource, error) {
	crID := CustomRouterUpstreams{}.CaddyModule().ID
	switch {
	case h.DynamicUpstreams != nil:
		if d, ok := h.DynamicUpstreams.(*CustomRouterUpstreams); ok {
			return poolSource{set: poolName(d.Pool)}, nil
		}
		return poolSource{dynamic: moduleName(h.DynamicUpstreams)}, nil
	case h.DynamicUpstreamsRaw != nil:
		var raw struct {
			Source string `json:"source"`
			Pool   string `json:"pool"`
		}
		if err := json.Unmarshal(h.DynamicUpstreamsRaw, &raw); err != nil {
			return poolSource{}, fmt.Errorf("reading the reverse_proxy's dynamic_upstreams: %v", err)
		}
		if raw.Source == crID.Name() {
			return poolSource{set: poolName(raw.Pool)}, nil
		}
		return poolSource{dynamic: crID.Namespace() + "." + raw.Source}, nil
	}
	var src poolSource
	for _, u := range h.Upstreams {
		src.static = append(src.static, u.Dial)
	}
	sort.Strings(src.static)
	return src, nil
}

// checkPoolSource records, in the config being provisioned, where proxy
// gives pool its upstreams, and refuses the config if an earlier handler
// gave it others. A policy outside a reverse_proxy, or a context without
// a config (a module provisioned on its own), has nothing to check.
func checkPoolSource(ctx caddy.Context, pool string, proxy *reverseproxy.Handler) error {
	if proxy == nil {
		return nil
	}
	app, ok := configApp(ctx)
	if !ok {
		return nil
	}
	src, err := sourceOf(proxy)
	if err != nil {
		return err
	}
	return app.claimPoolSource(pool, proxy, src)
}

// claimPoolSource is checkPoolSource on the config's app. The same
// handler provisioned again agrees with itself, whatever its source.
func (a *App) claimPoolSource(pool string, proxy *reverseproxy.Handler, src poolSource) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.pools[pool]
	if !ok {
		if a.pools == nil {
			a.pools = map[string]poolClaim{}
		}
		a.pools[pool] = poolClaim{src: src, proxy: proxy}
		return nil
	}
	if c.proxy == proxy || c.src.agrees(src) {
		return nil
	}
	// Sorted: the same message whichever handler Caddy provisioned first.
	pair := []string{c.src.String(), src.String()}
	sort.Strings(pair)
	return fmt.Errorf("pool %q gets different upstreams from two reverse_proxy handlers: one with %s, the other with %s; "+
		"its replica set would change with every request, and a queued request could go to the other's upstream: "+
		"give one of them another pool (pool <name> in its lb_policy block), or the same upstreams", pool, pair[0], pair[1])
}
