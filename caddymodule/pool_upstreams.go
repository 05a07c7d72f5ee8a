package caddymodule

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// A pool is one set of replicas. Without a managed backend set, a Sluice
// policy takes its pool's replicas from the upstream list of the request
// it picks for (selector.go), so two reverse_proxy handlers that give one
// pool different lists would swap its replica set on every request, and
// a request queued by one could be sent to the other's upstream, with its
// headers. The config is refused instead, naming the pool and both
// places; handlers that take the pool's backend set (dynamic
// custom_router <pool>) share it by design.

// pooledSelector is a Sluice selection policy: the pool it picks in.
type pooledSelector interface{ poolName() string }

func (s *selector) poolName() string { return s.pool.Name() }

// poolSource is where one reverse_proxy handler's upstreams come from.
type poolSource struct {
	site    string
	static  []string // static upstreams' dial addresses, sorted
	set     string   // dynamic custom_router: the pool whose backend set it returns
	dynamic string   // another dynamic source: its module
}

func (s poolSource) String() string {
	switch {
	case s.set != "":
		return fmt.Sprintf("%s (dynamic custom_router %s)", s.site, s.set)
	case s.dynamic != "":
		return fmt.Sprintf("%s (dynamic %s)", s.site, s.dynamic)
	}
	return fmt.Sprintf("%s (upstreams %s)", s.site, strings.Join(s.static, " "))
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

// checkPoolUpstreams refuses a config in which two reverse_proxy handlers
// with a Sluice policy on one pool disagree on its upstreams.
func checkPoolUpstreams(app *caddyhttp.App) error {
	byPool := map[string][]poolSource{}
	seen := map[*reverseproxy.Handler]bool{}
	forEachChain(app, func(chain []caddyhttp.MiddlewareHandler, site []string, _ chainKind) {
		for i, mh := range chain {
			rp, ok := mh.(*reverseproxy.Handler)
			if !ok || seen[rp] || rp.LoadBalancing == nil {
				continue
			}
			sel, ok := rp.LoadBalancing.SelectionPolicy.(pooledSelector)
			if !ok {
				continue
			}
			seen[rp] = true
			src := poolSource{site: site[i]}
			switch d := rp.DynamicUpstreams.(type) {
			case nil:
				for _, u := range rp.Upstreams {
					src.static = append(src.static, u.Dial)
				}
				sort.Strings(src.static)
			case *CustomRouterUpstreams:
				src.set = poolName(d.Pool)
			default:
				src.dynamic = moduleName(d)
			}
			byPool[sel.poolName()] = append(byPool[sel.poolName()], src)
		}
	})
	pools := make([]string, 0, len(byPool))
	for p := range byPool {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	for _, pool := range pools {
		srcs := byPool[pool]
		for i, s := range srcs {
			for _, t := range srcs[i+1:] {
				if !s.agrees(t) {
					return fmt.Errorf("pool %q gets different upstreams from two reverse_proxy handlers: %s and %s; "+
						"its replica set would change with every request, and a queued request could go to the other's upstream: "+
						"give one of them another pool (pool <name> in its lb_policy block), or the same upstreams", pool, s, t)
				}
			}
		}
	}
	return nil
}
