package caddymodule

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// The Sluice modules other than the selection policies, registered in one
// place (module IDs are part of the public interface; see docs/). Each
// selection policy registers itself, with its metrics, in its own file, so
// that adding one touches only that file and its lb package.
func init() {
	caddy.RegisterModule(App{})
	caddy.RegisterModule(FlowControl{})
	caddy.RegisterModule(CustomRouter{})
	caddy.RegisterModule(CustomRouterUpstreams{})
	caddy.RegisterModule(AdminAPI{})
	caddy.RegisterModule(InferenceSim{})

	// custom_router, then flow_control, then reverse_proxy: the contract's
	// own endpoints are never held in a flow-control queue.
	registerDirective("custom_router", "reverse_proxy", func() handlerModule { return new(CustomRouter) })
	registerDirective("flow_control", "reverse_proxy", func() handlerModule { return new(FlowControl) })
	registerDirective("inference_sim", "respond", func() handlerModule { return new(InferenceSim) })
}

// moduleInfo is what a module's CaddyModule returns.
func moduleInfo(id string, newModule func() caddy.Module) caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: caddy.ModuleID(id), New: newModule}
}

// handlerModule is a Sluice HTTP handler with a Caddyfile directive.
type handlerModule interface {
	caddyhttp.MiddlewareHandler
	caddyfile.Unmarshaler
	caddy.Provisioner
}

// registerDirective makes directive a Caddyfile directive ordered before
// the standard directive before.
func registerDirective(directive, before string, newModule func() handlerModule) {
	httpcaddyfile.RegisterHandlerDirective(directive, func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := newModule()
		return m, m.UnmarshalCaddyfile(h.Dispenser)
	})
	httpcaddyfile.RegisterDirectiveOrder(directive, httpcaddyfile.Before, before)
}

// Interface guards
var (
	_ caddy.App                   = (*App)(nil)
	_ reverseproxy.UpstreamSource = (*CustomRouterUpstreams)(nil)
	_ caddyfile.Unmarshaler       = (*CustomRouterUpstreams)(nil)
	_ caddy.AdminRouter           = (*AdminAPI)(nil)
	_ sharedState                 = (*policyState)(nil)
	_ sharedState                 = (*flowState)(nil)
)

var (
	_ handlerModule = (*FlowControl)(nil)
	_ handlerModule = (*CustomRouter)(nil)
	_ handlerModule = (*InferenceSim)(nil)
)

// policyModule is what every Sluice selection policy is.
type policyModule interface {
	reverseproxy.Selector
	caddy.Provisioner
	caddy.Validator
	caddy.CleanerUpper
	caddyfile.Unmarshaler
}
