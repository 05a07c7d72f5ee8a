package caddymodule

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/lb"
)

// A backend set may never send traffic to Caddy itself: not to its admin
// endpoint (the whole config, writable, would be reachable through the
// public port), and not back to the listener the request came in on (a
// loop).

// refuseOwnAddress returns an error if b is Caddy's admin endpoint or the
// local address r arrived on, however its host is spelled: a name is
// resolved (a trailing dot and case do not matter), and a wildcard
// listener is reached through every local address.
func refuseOwnAddress(b lb.Backend, r *http.Request) error {
	host, port, err := net.SplitHostPort(b.Dial)
	if err != nil {
		return nil // ParseBackend already refused what cannot be split
	}
	ips := resolveHost(r.Context(), host)
	if a, ok := adminAddress(); ok && a.port == port && a.coversAny(r.Context(), ips) {
		return fmt.Errorf("%q is Caddy's own admin endpoint", b.URL)
	}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if lh, lp, err := net.SplitHostPort(la.String()); err == nil && lp == port && (ownHost{lh}).coversAny(r.Context(), ips) {
			return fmt.Errorf("%q is this proxy's own listener (a loop)", b.URL)
		}
	}
	// The connection's local address is one of the listener's; a wildcard
	// listener is reached through every other local address too.
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil
		}
		for _, l := range srv.Listen {
			na, err := caddy.ParseNetworkAddress(l)
			if err != nil || na.IsUnixNetwork() || na.IsFdNetwork() || uint(p) < na.StartPort || uint(p) > na.EndPort {
				continue
			}
			if (ownHost{na.Host}).coversAny(r.Context(), ips) {
				return fmt.Errorf("%q is this proxy's own listener (a loop)", b.URL)
			}
		}
	}
	return nil
}

// resolveTimeout bounds the lookup of a backend's name: the API call
// waits for it, and a name that does not answer reaches nothing now.
const resolveTimeout = 2 * time.Second

// resolveHost returns the addresses host reaches: itself if an IP, else
// what the resolver says ("localhost" and names under .localhost are
// loopback without asking). A name that does not resolve gives none: it
// reaches nothing now. (A name may resolve elsewhere later: pin backends
// by IP, or restrict them with allowed_backends, where that matters.)
func resolveHost(ctx context.Context, host string) []netip.Addr {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip.Unmap()}
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil
	}
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	return ips
}

type listenAddress struct {
	ownHost
	port string
}

// ownHost is a host this process listens on.
type ownHost struct{ host string }

// coversAny reports whether any of a backend's addresses reaches this
// listener: the same address; any loopback one for a loopback listener;
// any local one (loopback, unspecified or an interface's) for a wildcard
// listener.
func (o ownHost) coversAny(ctx context.Context, backend []netip.Addr) bool {
	if len(backend) == 0 {
		return false
	}
	var listen []netip.Addr
	wildcard := o.host == ""
	if !wildcard {
		listen = resolveHost(ctx, o.host)
		for _, l := range listen {
			wildcard = wildcard || l.IsUnspecified()
		}
	}
	for _, b := range backend {
		if wildcard && (b.IsLoopback() || b.IsUnspecified() || isLocalAddress(b)) {
			return true
		}
		for _, l := range listen {
			if b == l || (b.IsLoopback() && l.IsLoopback()) {
				return true
			}
		}
	}
	return false
}

// isLocalAddress reports whether ip is one of this machine's interface
// addresses.
func isLocalAddress(ip netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if p, ok := a.(*net.IPNet); ok {
			if local, ok := netip.AddrFromSlice(p.IP); ok && local.Unmap() == ip {
				return true
			}
		}
	}
	return false
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
