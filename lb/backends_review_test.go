package lb

import (
	"strings"
	"testing"
)

// A port is a number: "08080" is port 8080 (Go dials it so), and must be
// the same replica as "8080": one dial key, collapsed as a duplicate, not
// a second replica that doubles the server's share of the traffic. Every
// check by port (Caddy's admin endpoint, its own listener) compares the
// key's port as text.
func TestLeadingZerosInAPortNameTheSameReplica(t *testing.T) {
	got, err := ParseBackends([]string{"http://10.0.0.1:8080", "http://10.0.0.1:08080", "https://[fd00::1]:0443"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Dial != "10.0.0.1:8080" || got[1].Dial != "[fd00::1]:443" || got[1].URL != "https://[fd00::1]:443" {
		t.Fatalf("ParseBackends = %+v; want 10.0.0.1:8080 once and [fd00::1]:443", got)
	}
}

// A refused address is quoted in the 400 answer and the warning log: a
// long one (a blob posted by mistake, 512 KiB) is quoted clipped, so a
// bad call costs neither a megabyte of log line nor of answer; the
// message still names the entry and shows how the address starts.
func TestARefusedLongAddressIsQuotedClipped(t *testing.T) {
	long := strings.Repeat("a", 1<<19)
	for _, bad := range []string{"http://" + long + ":1", long, "http://h:" + strings.Repeat("9", 1<<19),
		"http://h:1/" + long, "http://h:1%" + long, "ftp://" + long} {
		_, err := ParseBackends([]string{"http://ok:1", bad})
		if err == nil {
			t.Fatalf("%.20q… accepted", bad)
		}
		msg := err.Error()
		if len(msg) > 1024 || !strings.HasPrefix(msg, "backends[1]: ") || !strings.Contains(msg, bad[:20]) {
			t.Errorf("%.20q…: error of %d bytes %.300q; want under 1 KiB, naming backends[1] and quoting the start", bad, len(msg), msg)
		}
	}
}
