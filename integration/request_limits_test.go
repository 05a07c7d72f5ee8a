package integration

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestQLLWaitsForReplicasAtCaddysRequestLimit: Caddy's passive health
// `unhealthy_request_count` (max_requests in JSON) makes an upstream
// "full", not down. queued_least_latency must queue for a full replica and
// send the request when it frees, never fail the queue with backends_down
// (it answered 200 200 503 503 503 503 here).
func TestQLLWaitsForReplicasAtCaddysRequestLimit(t *testing.T) {
	for name, cfg := range map[string]string{
		"static upstreams": `
:9360 {
	reverse_proxy 127.0.0.1:9361 127.0.0.1:9362 {
		lb_policy queued_least_latency {
			pool limits-static
		}
		unhealthy_request_count 1
	}
}
`,
		"dynamic upstreams": `
:9360 {
	custom_router limits-dynamic
	reverse_proxy {
		dynamic custom_router limits-dynamic
		lb_policy queued_least_latency {
			pool limits-dynamic
		}
		unhealthy_request_count 1
	}
}
`,
	} {
		t.Run(name, func(t *testing.T) {
			startCaddy(t, globals+cfg+sims(9361, 9362))
			url := "http://127.0.0.1:9360"
			if name == "dynamic upstreams" {
				setBackends(t, url, "http://127.0.0.1:9361", "http://127.0.0.1:9362")
			}
			const n = 6
			served := map[string]int{}
			for o := range burst(url, n) {
				if o.err != nil || o.status != 200 {
					t.Fatalf("request answered %+v: a replica at its request limit is busy, not down", o)
				}
				served[o.replica]++
			}
			if served["sim-9361"] == 0 || served["sim-9362"] == 0 || served["sim-9361"]+served["sim-9362"] != n {
				t.Fatalf("served %v, want %d over both replicas", served, n)
			}
		})
	}
}

// TestSetBackendsRefusesEverySpellingOfCaddyItself: the own-address guard
// must see through spellings — a trailing dot, upper case, a name that
// resolves to loopback — and a wildcard listener is reached through every
// local address, not only loopback (localhost.:2999 answered 200).
func TestSetBackendsRefusesEverySpellingOfCaddyItself(t *testing.T) {
	startCaddy(t, qllConfig(9365, "spellings", "", 9366))
	url := "http://127.0.0.1:9365"
	setBackends(t, url, "http://127.0.0.1:9366")
	spellings := []string{
		"http://localhost.:2999", "http://LOCALHOST.:2999", "http://127.0.0.1.:2999",
		"http://localhost.:9365", "http://[::ffff:127.0.0.1]:2999",
	}
	for _, ip := range localNonLoopbackIPs() {
		// The site listens on the wildcard: every local address reaches it.
		spellings = append(spellings, "http://"+net.JoinHostPort(ip, "9365"))
	}
	for _, b := range spellings {
		for _, path := range []string{"/_custom_router/set-backends", "/add_worker?url=" + b} {
			var resp *http.Response
			var err error
			if path == "/_custom_router/set-backends" {
				resp, err = client.Post(url+path, "application/json", strings.NewReader(`{"backends": ["`+b+`"]}`))
			} else {
				resp, err = client.Post(url+path, "", nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 {
				t.Errorf("%s with %s: %d %s, want 400: it is Caddy itself", path, b, resp.StatusCode, msg)
			}
		}
	}
	if h := getHealth(t, url); len(h.Backends) != 1 || h.Backends[0].Addr != "127.0.0.1:9366" {
		t.Fatalf("a refused backend changed the set: %+v", h.Backends)
	}
}

// localNonLoopbackIPs lists this machine's own unicast addresses that are
// not loopback (a wildcard listener is reachable on each).
func localNonLoopbackIPs() []string {
	addrs, _ := net.InterfaceAddrs()
	var out []string
	for _, a := range addrs {
		if p, ok := a.(*net.IPNet); ok && !p.IP.IsLoopback() && p.IP.IsGlobalUnicast() && p.IP.To4() != nil {
			out = append(out, p.IP.String())
		}
	}
	return out
}
