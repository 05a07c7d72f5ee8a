package lb

import (
	"strings"
	"testing"
)

// A host whose last label is a number is an IPv4 address written in a
// form other than dotted decimal (2852039166, 0x7f000001, 127.1, 0):
// the C resolver (getaddrinfo, which Go uses on macOS and wherever
// nsswitch.conf asks for it) dials it as that address, so it slipped past
// the link-local, multicast and unspecified checks. No DNS name ends in a
// number (no top-level domain is numeric): it is refused, saying why.
func TestANumericHostIsRefusedAsAnUnusualIPv4Form(t *testing.T) {
	for _, bad := range []string{
		"http://2852039166:80", // 169.254.169.254, cloud metadata
		"http://0xa9fea9fe:80",
		"http://0XA9FEA9FE:80",
		"http://169.254.43518:80",
		"http://0251.0376.0251.0376:80",
		"http://0:8000", // 0.0.0.0
		"http://127.1:8000",
		"http://10.0.0.1.:8000",
		"http://replica.0x10:8000",
	} {
		b, err := ParseBackend(bad)
		if err == nil || !strings.Contains(err.Error(), "IPv4") {
			t.Errorf("%s: %+v, %v; want refused as an IPv4 address in an unusual form", bad, b, err)
		}
	}
	for _, good := range []string{"http://replica-1:8000", "http://r1.svc.cluster.local:8000", "http://10-0-0-1.pod:80",
		"http://0x.example:80", "http://1e3:80", "http://replica.0xg:80", "http://a1b2c3d4e5f6:8000"} {
		if _, err := ParseBackend(good); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
}
