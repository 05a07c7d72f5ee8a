package lb

import (
	"strings"
	"testing"
)

func TestParseBackends(t *testing.T) {
	got, err := ParseBackends([]string{"http://10.0.0.1:8080", " http://Replica-2:80/ ", "http://10.0.0.1:8080", "https://[::1]:443"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.1:8080", "replica-2:80", "[::1]:443"}
	if strings.Join(Dials(got), ",") != strings.Join(want, ",") {
		t.Fatalf("dials = %v, want %v", Dials(got), want)
	}
	if got[2].URL != "https://[::1]:443" {
		t.Fatalf("URL = %q", got[2].URL)
	}
	if bs, err := ParseBackends(nil); err != nil || len(bs) != 0 {
		t.Fatalf("empty list must be valid: %v %v", bs, err)
	}
}

// An IPv6 zone is the interface, not another address: a zoned forbidden
// address is still refused, and an accepted zoned one's URL parses back
// (the fuzzer found "http://[::%250]:1" accepted as http://[::%0]:1).
func TestParseBackendIPv6Zones(t *testing.T) {
	for _, s := range []string{"http://[::%250]:1", "http://[::%25eth0]:80", "http://[ff02::1%25eth0]:80"} {
		if b, err := ParseBackend(s); err == nil {
			t.Errorf("%q accepted as %+v", s, b)
		}
	}
	// A zone is an interface's name or index; anything else (the fuzzer
	// found a byte of invalid UTF-8, which url.URL then wrote as U+FFFD,
	// so the accepted URL did not parse back) is refused, naming it.
	for _, s := range []string{"http://[fd00::1%25\x80]:1", "http://[fd00::1%25eth%200]:1",
		"http://[fd00::1%25" + strings.Repeat("e", 16) + "]:1"} {
		if b, err := ParseBackend(s); err == nil || !strings.Contains(err.Error(), "zone") {
			t.Errorf("%q: %+v, %v; want refused for its zone", s, b, err)
		}
	}
	for _, zone := range []string{"eth0", "enp0s31f6", "br-1a2b3c", "veth1.2", "wlan_0", "3"} {
		b, err := ParseBackend("http://[fd00::1%25" + zone + "]:1")
		if err != nil {
			t.Errorf("zone %q refused: %v", zone, err)
			continue
		}
		if again, err := ParseBackend(b.URL); err != nil || again != b {
			t.Errorf("zone %q: %q does not parse back: %+v %v", zone, b.URL, again, err)
		}
	}
	if b, err := ParseBackend("http://[FD00::1%25ETH0]:1"); err != nil || b.Dial != "[fd00::1%ETH0]:1" {
		t.Errorf("an upper-case zone: %+v %v; want the address lowered and the interface's name kept", b, err)
	}
	b, err := ParseBackend("http://[fd00::1%25eth0]:8000")
	if err != nil || b.Dial != "[fd00::1%eth0]:8000" || b.URL != "http://[fd00::1%25eth0]:8000" {
		t.Fatalf("zoned ULA: %+v %v", b, err)
	}
	if again, err := ParseBackend(b.URL); err != nil || again != b {
		t.Fatalf("%q does not parse back: %+v %v", b.URL, again, err)
	}
}

func TestParseBackendsNamesTheBadEntry(t *testing.T) {
	for _, bad := range []string{"", "10.0.0.1:80", "ftp://h:1", "http://h", "http://h:0", "http://h:99999",
		"http://:80", "http://u:p@h:80", "http://h:80/v1", "http://h:80?x=1"} {
		_, err := ParseBackends([]string{"http://ok:1", bad})
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		if !strings.HasPrefix(err.Error(), "backends[1]") {
			t.Errorf("%q: error %q does not name the entry", bad, err)
		}
	}
}

func TestPoolWatchSeesEverySetInOrder(t *testing.T) {
	p := GetPool("test-watch")
	var seen []int
	cancel := p.Watch(func(set []Backend, managed bool) { seen = append(seen, len(set)) })
	bs, _ := ParseBackends([]string{"http://a:1", "http://b:1"})
	added, removed := p.Set(bs)
	if len(added) != 2 || len(removed) != 0 {
		t.Fatalf("added %v removed %v", added, removed)
	}
	added, removed = p.Set(bs[1:])
	if len(added) != 0 || len(removed) != 1 || removed[0] != "a:1" {
		t.Fatalf("added %v removed %v", added, removed)
	}
	cancel()
	p.Set(nil)
	if len(seen) != 3 || seen[0] != 0 || seen[1] != 2 || seen[2] != 1 {
		t.Fatalf("watch saw %v, want [0 2 1]", seen)
	}
	if !p.Managed() {
		t.Fatal("pool should be managed after Set")
	}
}

func TestBackendsThatCanNeverBeReplicasAreRefused(t *testing.T) {
	for _, bad := range []string{
		"http://169.254.169.254:80", // cloud metadata
		"http://[fe80::1]:8000",     // link-local IPv6
		"http://224.0.0.1:8000",     // multicast
		"http://[ff02::1]:8000",
		"http://0.0.0.0:8000", // unspecified
		"http://[::]:8000",
		"http://[::ffff:169.254.169.254]:80", // mapped
	} {
		if _, err := ParseBackend(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	for _, good := range []string{"http://10.0.0.5:8000", "http://127.0.0.1:8001", "http://[::1]:8000", "https://replica-1.internal:443"} {
		if _, err := ParseBackend(good); err != nil {
			t.Errorf("%s refused: %v", good, err)
		}
	}
}
