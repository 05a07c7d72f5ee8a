package integration

import (
	"encoding/json"
	"strings"
	"testing"
)

// twoSites is two sites whose queued_least_latency blocks name the same
// pool, with the given static upstreams.
func twoSites(first, second string) string {
	return globals + `
:9180 {
	reverse_proxy ` + first + ` {
		lb_policy queued_least_latency {
			pool two-sites
		}
	}
}
:9182 {
	reverse_proxy ` + second + ` {
		lb_policy queued_least_latency {
			pool two-sites
		}
	}
}
` + sims(9181, 9183)
}

// Two sites giving one pool different static upstreams would swap the
// pool's replica set on every request (a request queued through one site
// could go to the other's upstream): the config is refused, naming the
// pool and both sites, and the running config keeps serving. The same
// upstreams in both sites are one replica set, and load.
func TestTwoSitesOnOnePoolWithDifferentUpstreamsAreRefused(t *testing.T) {
	startCaddy(t, globals+`
:9180 {
	reverse_proxy 127.0.0.1:9181 {
		lb_policy queued_least_latency {
			pool two-sites
		}
	}
}
`+sims(9181, 9183))
	status, body := load(t, adapt(t, twoSites("127.0.0.1:9181", "127.0.0.1:9183")))
	if status == 200 {
		t.Fatal("a config giving pool two-sites two different upstream lists loaded")
	}
	var answer struct{ Error string }
	if json.Unmarshal([]byte(body), &answer) == nil {
		body = answer.Error
	}
	for _, want := range []string{`pool "two-sites"`, "upstreams 127.0.0.1:9181", "upstreams 127.0.0.1:9183"} {
		if !strings.Contains(body, want) {
			t.Errorf("refusal %q does not name %s", body, want)
		}
	}
	if o := complete("http://127.0.0.1:9180"); o.err != nil || o.status != 200 || o.replica != "sim-9181" {
		t.Fatalf("after the refused reload, the running config answered %+v", o)
	}

	reload(t, twoSites("127.0.0.1:9181", "127.0.0.1:9181"))
	for _, url := range []string{"http://127.0.0.1:9180", "http://127.0.0.1:9182"} {
		if o := complete(url); o.err != nil || o.status != 200 || o.replica != "sim-9181" {
			t.Fatalf("%s with the same upstreams in both sites: %+v", url, o)
		}
	}
}
