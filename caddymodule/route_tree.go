package caddymodule

import (
	"sort"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Walking Caddy's route tree once the config is provisioned: flow_control
// finds the reverse_proxy it guards (flow_control_replicas.go,
// upstream_tls.go), and the read-ahead check looks for a reverse_proxy
// in error and named routes (body_read_ahead.go). Pool upstream conflicts
// are refused earlier, while the config provisions (pool_upstreams.go).

// chainKind says which of a server's route lists a chain comes from.
type chainKind int

const (
	primaryChain chainKind = iota // the routes every request meets
	errorsChain                   // handle_errors: after a handler failed
	namedChain                    // a named route, run where invoke says
)

// forEachChain calls fn with each server's handlers in the order a request
// meets them (subroutes flattened in place), and the same for its error
// routes and named routes.
func forEachChain(app *caddyhttp.App, fn func(chain []caddyhttp.MiddlewareHandler, kind chainKind)) {
	names := make([]string, 0, len(app.Servers))
	for name := range app.Servers {
		names = append(names, name)
	}
	sort.Strings(names) // the same order on every load
	for _, name := range names {
		srv := app.Servers[name]
		var chain []caddyhttp.MiddlewareHandler
		for _, rt := range srv.Routes {
			chain = flattenRoute(rt, chain)
		}
		fn(chain, primaryChain)
		if srv.Errors != nil {
			chain = nil
			for _, rt := range srv.Errors.Routes {
				chain = flattenRoute(rt, chain)
			}
			fn(chain, errorsChain)
		}
		for _, rt := range srv.NamedRoutes {
			fn(flattenRoute(*rt, nil), namedChain)
		}
	}
}

// flattenRoute appends rt's handlers to chain, subroutes flattened in
// place.
func flattenRoute(rt caddyhttp.Route, chain []caddyhttp.MiddlewareHandler) []caddyhttp.MiddlewareHandler {
	for _, mh := range rt.Handlers {
		chain = append(chain, mh)
		if sr, ok := mh.(*caddyhttp.Subroute); ok {
			for _, sub := range sr.Routes {
				chain = flattenRoute(sub, chain)
			}
		}
	}
	return chain
}
