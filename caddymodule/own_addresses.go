package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
)

// A backend set may never send traffic to Caddy itself: not to its admin
// endpoint (the whole config, writable, would be reachable through the
// public port), and not back to the listener the request came in on (a
// loop).

// refuseOwnAddress returns an error if b is Caddy's admin endpoint or the
// local address r arrived on.
func refuseOwnAddress(b lb.Backend, r *http.Request) error {
	host, port, err := net.SplitHostPort(b.Dial)
	if err != nil {
		return nil // ParseBackend already refused what cannot be split
	}
	if a, ok := adminAddress(); ok && a.port == port && a.covers(host) {
		return fmt.Errorf("%q is Caddy's own admin endpoint", b.URL)
	}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if lh, lp, err := net.SplitHostPort(la.String()); err == nil && lp == port && (ownHost{lh}).covers(host) {
			return fmt.Errorf("%q is this proxy's own listener (a loop)", b.URL)
		}
	}
	return nil
}

type listenAddress struct {
	ownHost
	port string
}

// ownHost is a host this process listens on.
type ownHost struct{ host string }

// covers reports whether a backend host reaches this listener: the same
// IP, a loopback host for a loopback or wildcard listener.
func (o ownHost) covers(host string) bool {
	backend, err := netip.ParseAddr(host)
	if strings.EqualFold(host, "localhost") {
		backend, err = netip.MustParseAddr("127.0.0.1"), nil
	}
	if err != nil {
		return false // a DNS name: cannot tell without resolving
	}
	backend = backend.Unmap()
	listen, err := netip.ParseAddr(o.host)
	if strings.EqualFold(o.host, "localhost") {
		listen, err = netip.MustParseAddr("127.0.0.1"), nil
	}
	if o.host == "" || (err == nil && listen.IsUnspecified()) {
		return backend.IsLoopback() || backend.IsUnspecified()
	}
	if err != nil {
		return false
	}
	listen = listen.Unmap()
	return backend == listen || (backend.IsLoopback() && listen.IsLoopback())
}

// adminAddress is the admin endpoint of the running config. Caddy keeps
// the admin config to itself, so it is read from the active context by
// reflection (pinned by an integration test: a Caddy upgrade that moves
// it fails that test, not production); without a config, Caddy's default.
func adminAddress() (listenAddress, bool) {
	listen := caddy.DefaultAdminListen
	if cfg := reflect.ValueOf(caddy.ActiveContext()).FieldByName("cfg"); cfg.IsValid() && !cfg.IsNil() {
		if admin := cfg.Elem().FieldByName("Admin"); admin.IsValid() && !admin.IsNil() {
			if admin.Elem().FieldByName("Disabled").Bool() {
				return listenAddress{}, false
			}
			if l := admin.Elem().FieldByName("Listen").String(); l != "" {
				listen = l
			}
		}
	}
	na, err := caddy.ParseNetworkAddress(listen)
	if err != nil || na.IsUnixNetwork() || na.IsFdNetwork() {
		return listenAddress{}, false
	}
	return listenAddress{ownHost{na.Host}, fmt.Sprint(na.StartPort)}, true
}
