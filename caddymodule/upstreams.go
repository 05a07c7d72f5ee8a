package caddymodule

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
)

// CustomRouterUpstreams feeds reverse_proxy the backend set of a pool, as
// last given by set-backends (or the admin API, or restored from disk):
//
//	reverse_proxy {
//	    dynamic custom_router [<pool>]
//	}
//
// An empty or never-set pool yields no upstreams. Dynamic upstreams get no
// active health checks from Caddy; Sluice's policies mark failing replicas
// down passively.
type CustomRouterUpstreams struct {
	Pool string `json:"pool,omitempty"`

	pool *lb.Pool
}

// CaddyModule returns the Caddy module information.
func (CustomRouterUpstreams) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("http.reverse_proxy.upstreams.custom_router", func() caddy.Module { return new(CustomRouterUpstreams) })
}

// Provision implements caddy.Provisioner.
func (u *CustomRouterUpstreams) Provision(ctx caddy.Context) error {
	name := poolName(u.Pool)
	if err := validatePoolName(name); err != nil {
		return fmt.Errorf("dynamic custom_router: %v", err)
	}
	if err := usePool(ctx, name, ctx.Logger()); err != nil {
		return fmt.Errorf("dynamic custom_router: %v", err)
	}
	u.pool = lb.GetPool(name)
	return nil
}

// GetUpstreams implements reverseproxy.UpstreamSource. Caddy requires
// fresh Upstream values on each call.
func (u *CustomRouterUpstreams) GetUpstreams(*http.Request) ([]*reverseproxy.Upstream, error) {
	set, _ := u.pool.Backends()
	ups := make([]*reverseproxy.Upstream, len(set))
	for i, b := range set {
		ups[i] = &reverseproxy.Upstream{Dial: b.Dial}
	}
	return ups, nil
}

// UnmarshalCaddyfile parses `dynamic custom_router [<pool>]`.
func (u *CustomRouterUpstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // source name
	if d.NextArg() {
		u.Pool = d.Val()
	}
	if d.NextArg() {
		return d.Errf("dynamic custom_router: takes at most one argument, the pool name; got extra %q", d.Val())
	}
	if d.NextBlock(0) {
		return d.Errf("dynamic custom_router: takes no block, only an optional pool name")
	}
	return nil
}
