package lb

import (
	"net"
	"strconv"
	"testing"
)

// FuzzParseBackend: add_worker's url and every set-backends entry. An
// accepted backend is scheme://host:port with a valid port, parses back to
// itself, and is never a forbidden address.
func FuzzParseBackend(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:8001", "https://a.example:443", "http://[::1]:1", "10.0.0.1",
		"http://169.254.169.254:80", "http://h:0", "http://u@h:1", "http://h:1/p?q", " http://H:1 ", "http://[fe80::1%25eth0]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBackend(s)
		if err != nil {
			return
		}
		host, port, err := net.SplitHostPort(b.Dial)
		if err != nil || host == "" {
			t.Fatalf("%q accepted with dial %q", s, b.Dial)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			t.Fatalf("%q accepted with port %q", s, port)
		}
		again, err := ParseBackend(b.URL)
		if err != nil || again != b {
			t.Fatalf("%q: %+v does not parse back (%+v, %v)", s, b, again, err)
		}
	})
}
