package integration

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// sharedListenAddrs returns the local addresses on which this process has
// more than one listening TCP socket. It asks each of the process's own
// sockets (/proc/self/fd) rather than reading /proc/net/tcp, which lists
// every socket of the network namespace (tens of thousands in TIME_WAIT on
// a busy machine: tens of milliseconds a read).
func sharedListenAddrs() ([]string, error) {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	count := make(map[string]int)
	for _, e := range fds {
		// A descriptor closed (and its number reused) since ReadDir is
		// only read here: at worst one poll counts a socket opened after
		// the load, never misses an old listener still open.
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if on, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err != nil || on != 1 {
			continue
		}
		if typ, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TYPE); err != nil || typ != syscall.SOCK_STREAM {
			continue
		}
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			continue
		}
		switch a := sa.(type) {
		case *syscall.SockaddrInet4:
			count[net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))]++
		case *syscall.SockaddrInet6:
			count[net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))]++
		}
	}
	var dup []string
	for addr, n := range count {
		if n > 1 {
			dup = append(dup, addr)
		}
	}
	return dup, nil
}
