package caddymodule

import (
	"net"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// upstreamScheme is how a reverse_proxy reaches its static upstreams: over
// TLS when its HTTP transport has a tls block (what `to https://…` writes),
// except on the ports that block exempts. A static upstream is only a dial
// address; without this the engine metrics of TLS replicas were scraped
// over plain HTTP, and their engine signals were lost.
type upstreamScheme struct {
	tls bool
	// except is the transport's tls except_ports, joined by commas: kept
	// comparable, so a static set is re-applied when a reload changes it.
	except string
}

// schemeOfProxy is h's upstreamScheme: plain HTTP without a handler, or
// with a transport other than Caddy's HTTP one.
func schemeOfProxy(h *reverseproxy.Handler) upstreamScheme {
	if h == nil {
		return upstreamScheme{}
	}
	t, ok := h.Transport.(*reverseproxy.HTTPTransport)
	if !ok || t.TLS == nil {
		return upstreamScheme{}
	}
	return upstreamScheme{tls: true, except: strings.Join(t.TLS.ExceptPorts, ",")}
}

// enclosingProxy is the reverse_proxy handler whose module tree ctx is
// provisioning, or nil. reverse_proxy loads its transport before its
// selection policy, so a policy provisioned inside one sees the transport.
func enclosingProxy(ctx caddy.Context) *reverseproxy.Handler {
	mods := ctx.Modules()
	for i := len(mods) - 1; i >= 0; i-- {
		if h, ok := mods[i].(*reverseproxy.Handler); ok {
			return h
		}
	}
	return nil
}

// url is the base URL of the upstream at dial, as Caddy's HTTP transport
// reaches it.
func (s upstreamScheme) url(dial string) string {
	if s.tls {
		_, port, err := net.SplitHostPort(dial)
		if err != nil || s.except == "" || !slices.Contains(strings.Split(s.except, ","), port) {
			return "https://" + dial
		}
	}
	return "http://" + dial
}
