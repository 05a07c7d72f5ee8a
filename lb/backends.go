// Package lb holds Sluice's load-balancing logic. It imports nothing from
// Caddy, so every policy can be tested with plain `go test`.
package lb

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Backend is one replica address as given to set-backends, validated and
// normalised. Dial ("host:port") is the key every policy uses; URL keeps
// the scheme the operator gave.
type Backend struct {
	URL  string `json:"url"`
	Dial string `json:"dial"`
}

// ParseBackends validates a backend list: every entry must be an absolute
// http(s) URL with a host and an explicit port, and no path, query or user
// info. Duplicates (same dial address) are collapsed, keeping the first
// occurrence, so order is stable. An empty list is valid: it means "no
// backends", and requests then fail fast.
func ParseBackends(raw []string) ([]Backend, error) {
	out := make([]Backend, 0, len(raw))
	seen := make(map[string]bool, len(raw))
	for i, s := range raw {
		b, err := ParseBackend(s)
		if err != nil {
			return nil, fmt.Errorf("backends[%d]: %w", i, err)
		}
		if seen[b.Dial] {
			continue
		}
		seen[b.Dial] = true
		out = append(out, b)
	}
	return out, nil
}

// ParseBackend validates one backend address (see ParseBackends).
func ParseBackend(s string) (Backend, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Backend{}, fmt.Errorf("empty address")
	}
	q := quoteClipped(s)
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, quoted already
		}
		return Backend{}, fmt.Errorf("%s is not a URL: %s", q, clip(err.Error()))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return Backend{}, fmt.Errorf("%s: scheme must be http or https", q)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return Backend{}, fmt.Errorf("%s: only scheme://host:port is allowed (no user, path, query or fragment)", q)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return Backend{}, fmt.Errorf("%s: missing host", q)
	}
	if port == "" {
		return Backend{}, fmt.Errorf("%s: missing port", q)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return Backend{}, fmt.Errorf("%s: bad port %s", q, quoteClipped(port))
	}
	// Written back as a number: Go dials "02019" as port 2019, and the
	// dial key is compared as text (duplicates, Caddy's own ports).
	port = strconv.Itoa(n)
	if ip, err := netip.ParseAddr(host); err == nil {
		// The zone (fe80::1%eth0) names an interface, not another address:
		// "::%0" is the unspecified address all the same.
		if why := forbiddenIP(ip.WithZone("").Unmap()); why != "" {
			return Backend{}, fmt.Errorf("%s: %s addresses are never backends", q, why)
		}
		if z := ip.Zone(); z != "" && !validZone(z) {
			return Backend{}, fmt.Errorf("%s: IPv6 zone %s is not an interface name or index", q, quoteClipped(z))
		}
	} else if !validHostname(host) {
		return Backend{}, fmt.Errorf("%s: host %s is neither an IP address nor a host name", q, quoteClipped(host))
	} else if endsInANumber(host) {
		return Backend{}, fmt.Errorf("%s: host %s is an IPv4 address in another form than a.b.c.d (a resolver may dial it as one, unchecked): write it a.b.c.d", q, quoteClipped(host))
	}
	// Host names and IPv6 hex digits are case-blind; a zone, an interface
	// name, is not (Linux's "ETH0" is not "eth0").
	addr, zone, zoned := strings.Cut(host, "%")
	host = strings.ToLower(addr)
	if zoned {
		host += "%" + zone
	}
	dial := net.JoinHostPort(host, port)
	// url.URL writes an IPv6 zone's '%' as %25, so the URL parses back.
	return Backend{URL: (&url.URL{Scheme: u.Scheme, Host: dial}).String(), Dial: dial}, nil
}

// maxQuoted bounds the part of an address an error quotes: the error is
// the API's 400 answer and a log line, and an address may be as long as
// the body (1 MiB).
const maxQuoted = 128

// quoteClipped quotes s, cut to maxQuoted bytes (on a character
// boundary) and saying how long it was.
func quoteClipped(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:clipAt(s)], len(s))
}

// clip is quoteClipped without the quotes, for a message.
func clip(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:clipAt(s)], len(s))
}

func clipAt(s string) int {
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return cut
}

// PlainBackends returns a backend per address, reached at http://addr:
// a set given as bare dial addresses (lb.Picker's SetReplicas).
func PlainBackends(addrs []string) []Backend {
	out := make([]Backend, len(addrs))
	for i, a := range addrs {
		out[i] = Backend{URL: "http://" + a, Dial: a}
	}
	return out
}

// Dials returns the dial addresses of bs, in order.
func Dials(bs []Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.Dial
	}
	return out
}

// forbiddenIP names the class of ip if no replica can live there: cloud
// metadata and other link-local services, multicast, the unspecified
// address ("this host, any interface").
func forbiddenIP(ip netip.Addr) string {
	switch {
	case ip.IsLinkLocalUnicast():
		return "link-local (e.g. cloud metadata)"
	case ip.IsMulticast(), ip.IsLinkLocalMulticast(), ip.IsInterfaceLocalMulticast():
		return "multicast"
	case ip.IsUnspecified():
		return "unspecified"
	}
	return ""
}

// validZone reports whether z can name an interface: 1-15 letters,
// digits, '.', '-' and '_' (Linux's IFNAMSIZ less its NUL; an index is
// digits). Anything else is no interface, and a byte that is not UTF-8
// came back from url.URL as U+FFFD: the backend's URL would not parse.
func validZone(z string) bool {
	if len(z) == 0 || len(z) > 15 {
		return false
	}
	for i := 0; i < len(z); i++ {
		c := z[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// endsInANumber reports whether host's last label (after a trailing dot)
// is a number, decimal or 0x hex: the C resolver's inet_aton, and the URL
// standard, read such a host as an IPv4 address (2852039166 is
// 169.254.169.254, 127.1 is 127.0.0.1, 0 is 0.0.0.0). No DNS name ends so:
// no top-level domain is numeric.
func endsInANumber(host string) bool {
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	last := labels[len(labels)-1]
	if hex, ok := strings.CutPrefix(strings.ToLower(last), "0x"); ok {
		return strings.Trim(hex, "0123456789abcdef") == ""
	}
	return last != "" && strings.Trim(last, "0123456789") == ""
}

// validHostname reports whether h is a DNS host name: dot-separated labels
// of letters, digits, '-' and '_' (not starting or ending with '-').
func validHostname(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
