package caddymodule

import (
	"sort"
	"strings"

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
// routes and named routes. site[i] names where chain[i] is configured, for
// error messages: the site's host names, else its listener addresses.
func forEachChain(app *caddyhttp.App, fn func(chain []caddyhttp.MiddlewareHandler, site []string, kind chainKind)) {
	names := make([]string, 0, len(app.Servers))
	for name := range app.Servers {
		names = append(names, name)
	}
	sort.Strings(names) // the same order, hence the same message, on every load
	for _, name := range names {
		srv := app.Servers[name]
		listen := "site " + strings.Join(srv.Listen, " ")
		var chain []caddyhttp.MiddlewareHandler
		var site []string
		for _, rt := range srv.Routes {
			chain, site = flattenRoute(rt, chain, site, siteName(rt, listen))
		}
		fn(chain, site, primaryChain)
		if srv.Errors != nil {
			chain, site = nil, nil
			for _, rt := range srv.Errors.Routes {
				chain, site = flattenRoute(rt, chain, site, siteName(rt, listen)+" (handle_errors)")
			}
			fn(chain, site, errorsChain)
		}
		for rname, rt := range srv.NamedRoutes {
			chain, site := flattenRoute(*rt, nil, nil, "named route "+rname)
			fn(chain, site, namedChain)
		}
	}
}

// flattenRoute appends rt's handlers to chain, subroutes flattened in
// place, each named label in site.
func flattenRoute(rt caddyhttp.Route, chain []caddyhttp.MiddlewareHandler, site []string, label string) ([]caddyhttp.MiddlewareHandler, []string) {
	for _, mh := range rt.Handlers {
		chain, site = append(chain, mh), append(site, label)
		if sr, ok := mh.(*caddyhttp.Subroute); ok {
			for _, sub := range sr.Routes {
				chain, site = flattenRoute(sub, chain, site, label)
			}
		}
	}
	return chain, site
}

// siteName is a top-level route's host names (a Caddyfile site with
// addresses), else the server's listener addresses.
func siteName(rt caddyhttp.Route, listen string) string {
	var hosts []string
	for _, set := range rt.MatcherSets {
		for _, m := range set {
			switch h := m.(type) {
			case *caddyhttp.MatchHost:
				hosts = append(hosts, (*h)...)
			case caddyhttp.MatchHost:
				hosts = append(hosts, h...)
			}
		}
	}
	if len(hosts) == 0 {
		return listen
	}
	return "site " + strings.Join(hosts, " ")
}
