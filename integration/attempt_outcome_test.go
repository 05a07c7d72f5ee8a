package integration

import (
	"fmt"
	"testing"
)

// The outcome of an attempt comes from that attempt: when the chosen
// replica is dead and handle_errors proxies the request elsewhere, the
// second proxy's 200 must not be credited to the dead replica.
func TestDeadReplicaIsAFailureEvenWhenHandleErrorsProxiesElsewhere(t *testing.T) {
	site, sim, dead := 9851, 9852, 9853 // nothing listens on dead
	startCaddy(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	route {
		custom_router ao
		reverse_proxy {
			dynamic custom_router ao
			lb_policy queued_least_latency {
				pool ao
				state_log_interval -1
			}
		}
	}
	handle_errors {
		reverse_proxy 127.0.0.1:%d
	}
}
`, site, sim)+sims(sim))
	url := fmt.Sprintf("http://127.0.0.1:%d", site)
	setBackends(t, url, fmt.Sprintf("http://127.0.0.1:%d", dead))
	if o := complete(url); o.status != 200 || o.replica != fmt.Sprintf("sim-%d", sim) {
		t.Fatalf("handle_errors did not answer: %+v", o)
	}
	h := getHealth(t, url)
	if len(h.Backends) != 1 {
		t.Fatalf("health: %+v", h)
	}
	b := h.Backends[0]
	if b.Failures != 1 || !b.Down || b.EWMALatency != 0 {
		t.Fatalf("the dead replica was credited with the fallback's success: %+v", b)
	}
}
