package caddymodule

import (
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// A replica outside the request's (stale) pool gets an upstream Sluice
// makes; the same one for the same address, so Caddy's per-host counts
// add up. Those upstreams are forgotten past a bound: with replicas'
// addresses churning (pods rescheduled), one kept for each address ever
// dispatched to grew for the process's life.
func TestSluiceMadeUpstreamsAreBounded(t *testing.T) {
	pool := reverseproxy.UpstreamPool{{Dial: "127.0.0.1:1", Host: new(reverseproxy.Host)}}
	if u := upstreamFor(pool, "127.0.0.1:1"); u != pool[0] {
		t.Fatal("a replica of the pool must get the pool's upstream")
	}
	a := upstreamFor(pool, "10.0.0.1:8000")
	if b := upstreamFor(pool, "10.0.0.1:8000"); a != b {
		t.Fatal("one address outside the pool got two upstreams")
	}
	for i := range 3 * maxSluiceUpstreams {
		upstreamFor(pool, fmt.Sprintf("10.1.%d.%d:8000", i/256, i%256))
	}
	if n := sluiceUpstreams.len(); n > maxSluiceUpstreams {
		t.Fatalf("%d upstreams kept for replicas outside the pool, want at most %d", n, maxSluiceUpstreams)
	}
}
