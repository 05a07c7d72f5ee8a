package caddymodule

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// A body net/http knows is in memory goes to the replica in the same write
// as the headers (requestInfo.bodyFor); any other is written after the
// headers were flushed on their own, a write system call more per request,
// which on small requests costs the proxy more than reading the body. So
// every policy reads a small body (stated length up to smallBodyBytes)
// whole before it picks, even one that routes without the prompt — where
// that loses nothing: reading it consumes the client's body
// (reverse_proxy's copy of the request shares it), which a reverse_proxy
// in handle_errors (or a named route) sends again after a dial error, and
// without a Sluice handler in front (custom_router keeps the body, see
// kept_body.go) nothing could give it back. In a config with such a
// reverse_proxy, a policy that does not need the prompt leaves a body it
// cannot give back unread.

// readAheadSafe reports whether a policy of the config ctx belongs to may
// read a small body ahead without a Sluice handler keeping it: no
// reverse_proxy in any server's error routes or named routes. Without an
// http app (a module provisioned on its own) there is none.
func readAheadSafe(ctx caddy.Context) bool {
	v, err := ctx.AppIfConfigured("http")
	if err != nil {
		return true
	}
	app, ok := v.(*caddyhttp.App)
	if !ok {
		return true
	}
	safe := true
	forEachChain(app, func(chain []caddyhttp.MiddlewareHandler, kind chainKind) {
		if kind == primaryChain {
			return
		}
		for _, mh := range chain {
			if _, ok := mh.(*reverseproxy.Handler); ok {
				safe = false
			}
		}
	})
	return safe
}
