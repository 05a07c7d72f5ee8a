package caddymodule

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

// findReplicas runs when the config starts, once every module is
// provisioned: it finds the reverse_proxy this handler guards — the first
// one after it in its server's routes — and keeps its static upstreams,
// which then count as the pool's replicas while the pool has no managed
// backend set (as the Sluice policies pick among them). It refuses a
// config where the count cannot be known, naming what to add.
func (h *FlowControl) findReplicas() error {
	h.static = nil
	app, err := h.ctx.AppIfConfigured("http")
	if err != nil {
		return nil // no HTTP app: nothing proxies through this handler
	}
	var mine *reverseproxy.Handler
	var same []*reverseproxy.Handler // those after the other blocks on this pool
	found := false
	forEachChain(app.(*caddyhttp.App), func(chain []caddyhttp.MiddlewareHandler, _ chainKind) {
		for i, mh := range chain {
			fc, ok := mh.(*FlowControl)
			if !ok || fc.name != h.name || fc.Replicas > 0 {
				continue
			}
			rp := nextProxy(chain[i+1:])
			if fc == h {
				found, mine = true, rp
			} else {
				same = append(same, rp)
			}
		}
	})
	if !found {
		return nil
	}
	if h.Replicas > 0 {
		// The count is fixed; the static upstreams are still the replicas
		// the utilization detector scrapes.
		if mine != nil && mine.DynamicUpstreams == nil {
			h.static = staticBackends(mine.Upstreams, schemeOfProxy(mine))
		}
		return nil
	}
	name := h.name
	if mine == nil {
		if !poolWillHaveSet(name) {
			h.log.Warn("flow_control: no reverse_proxy follows it and its pool has no backend set: "+
				"max_concurrency bounds everything after it (set replicas N to change that)", zap.String("pool", name))
		}
		return nil
	}
	if mine.DynamicUpstreams != nil {
		if src, ok := mine.DynamicUpstreams.(*CustomRouterUpstreams); ok {
			if p := poolName(src.Pool); p != name {
				return fmt.Errorf("flow_control %s: the reverse_proxy after it takes its upstreams from pool %q, "+
					"so flow control would count the wrong replicas: write flow_control %s, or set replicas N", name, p, p)
			}
			return nil // follows the pool's backend set
		}
		if poolWillHaveSet(name) {
			return nil
		}
		return fmt.Errorf("flow_control %s: no replicas known: the reverse_proxy after it has dynamic upstreams (%s) "+
			"flow control cannot count; use dynamic custom_router %s (its backend set), static upstreams, or set replicas N",
			name, moduleName(mine.DynamicUpstreams), name)
	}
	for _, rp := range same {
		if rp != nil && rp.DynamicUpstreams == nil && len(rp.Upstreams) != len(mine.Upstreams) {
			return fmt.Errorf("flow_control %s: two blocks on this pool guard reverse_proxies with %d and %d upstreams; "+
				"give one of them another pool, or set replicas N", name, len(mine.Upstreams), len(rp.Upstreams))
		}
	}
	h.static = staticBackends(mine.Upstreams, schemeOfProxy(mine))
	if lbp := mine.LoadBalancing; lbp != nil {
		if _, random := lbp.SelectionPolicy.(*reverseproxy.RandomSelection); random {
			// Flow control decides when, not where: measured (flow-new-user),
			// random sends the request a freed slot lets in to a busy
			// replica 3 times in 4 with one-at-a-time replicas.
			h.log.Warn("flow_control: the reverse_proxy after it picks replicas at random (Caddy's default), so a request "+
				"flow control lets in can land on a busy replica while another is idle; use lb_policy least_conn or a Sluice policy",
				zap.String("pool", name))
		}
	}
	return nil
}

func moduleName(v any) string {
	if m, ok := v.(caddy.Module); ok {
		return string(m.CaddyModule().ID)
	}
	return fmt.Sprintf("%T", v)
}

// nextProxy is the first reverse_proxy in chain, nil if none.
func nextProxy(chain []caddyhttp.MiddlewareHandler) *reverseproxy.Handler {
	for _, mh := range chain {
		if rp, ok := mh.(*reverseproxy.Handler); ok {
			return rp
		}
	}
	return nil
}

// replicaView is what flow control knows of the pool's replicas.
type replicaView struct {
	managed bool
	set     []lb.Backend // the pool's backend set (managed)
	count   int          // replicas N from the config (0: not set)
	static  []lb.Backend // the reverse_proxy's static upstreams
}

// backends are the replicas to watch: the managed set, else the static
// upstreams.
func (v *replicaView) backends() []lb.Backend {
	if v.managed {
		return v.set
	}
	return v.static
}

// replicas is the count the concurrency detector multiplies
// max_concurrency by. With nothing known (an empty set, a config that
// proxies nothing) it is 1: max_concurrency then bounds the whole pool.
func (v *replicaView) replicas() int {
	if v.count > 0 {
		return v.count
	}
	return max(len(v.backends()), 1)
}
