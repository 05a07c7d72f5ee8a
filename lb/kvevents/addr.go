package kvevents

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// checkHostPort accepts host:port with a non-empty host and a port in 1..65535.
func checkHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", hp, err)
	}
	if host == "" {
		return fmt.Errorf("%q has no host", hp)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port must be 1..65535", hp)
	}
	return nil
}

// ParseListenAddr validates a listen address: tcp://host:port only, where
// host is an IP, a host name or * (every interface), and returns the
// host:port to listen on. Port 0 is refused: engines must be told where
// to dial, so a configured address names its port.
func ParseListenAddr(addr string) (string, error) { return parseListenAddr(addr, 1) }

// parseListenAddr is ParseListenAddr with the least port allowed (Listen
// takes 0: any free port, read back with Listener.Addr).
func parseListenAddr(addr string, minPort int) (string, error) {
	rest, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return "", fmt.Errorf("kv_events: listen address %q must be tcp://host:port", addr)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("kv_events: listen address %q must be tcp://host:port: %v", addr, err)
	}
	if host == "" {
		return "", fmt.Errorf("kv_events: listen address %q has no host (use * or 0.0.0.0 for every interface)", addr)
	}
	if strings.ContainsAny(host, "/?#@ ") {
		return "", fmt.Errorf("kv_events: listen address %q: bad host %q", addr, host)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < minPort || p > 65535 {
		return "", fmt.Errorf("kv_events: listen address %q: port must be %d..65535", addr, minPort)
	}
	if host == "*" {
		host = ""
	}
	return net.JoinHostPort(host, port), nil
}
