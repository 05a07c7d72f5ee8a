package integration

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// The outcome of an attempt comes from that attempt: when the chosen
// replica is dead and handle_errors proxies the request elsewhere, the
// second proxy's 200 must not be credited to the dead replica.
func TestDeadReplicaIsAFailureEvenWhenHandleErrorsProxiesElsewhere(t *testing.T) {
	site, sim, dead := 9851, 9852, 9853                     // nothing listens on dead
	pool := fmt.Sprintf("ao-%d", time.Now().UnixNano()%1e9) // a pool's state outlives a config (-count=2)
	startCaddy(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	route {
		custom_router %s
		reverse_proxy {
			dynamic custom_router %s
			lb_policy queued_least_latency {
				pool %s
				state_log_interval -1
			}
		}
	}
	handle_errors {
		reverse_proxy 127.0.0.1:%d
	}
}
`, site, pool, pool, pool, sim)+sims(sim))
	url := fmt.Sprintf("http://127.0.0.1:%d", site)
	setBackends(t, url, fmt.Sprintf("http://127.0.0.1:%d", dead))
	if o := complete(url); o.status != 200 || o.replica != fmt.Sprintf("sim-%d", sim) {
		t.Fatalf("handle_errors did not answer: %+v", o)
	}
	// The failed attempt is released when the request ends, just after the
	// fallback's answer reached the client (a dial error may be one of a
	// dual-stack dial's two: the transport's end is what says it failed).
	var h health
	eventually(t, "the dead replica's attempt to be released", func() bool {
		h = getHealth(t, url)
		if len(h.Backends) != 1 {
			t.Fatalf("health: %+v", h)
		}
		return h.Backends[0].InFlight == 0
	})
	if b := h.Backends[0]; b.Failures != 1 || !b.Down || b.EWMALatency != 0 {
		t.Fatalf("the dead replica was credited with the fallback's success: %+v", b)
	}
}

// A policy that reads the prompt reads the client's body in Select, on
// reverse_proxy's copy of the request, which shares the client's body:
// read, it was gone for a handle_errors reverse_proxy to a fallback, which
// then sent an empty body (502 instead of the fallback's answer). So does
// one that reads a small body ahead for its write (body_read_ahead.go).
// Ports 9590-9598.
func TestHandleErrorsFallbackGetsTheBodyAPolicyRead(t *testing.T) {
	for i, policy := range []string{"cache_aware", "load_aware", "queued_least_latency"} {
		t.Run(policy, func(t *testing.T) {
			site, sim, dead := 9590+3*i, 9591+3*i, 9592+3*i // nothing listens on dead
			startCaddy(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	route {
		custom_router hebody-%s
		reverse_proxy {
			dynamic custom_router hebody-%s
			lb_policy %s {
				pool hebody-%s
			}
		}
	}
	handle_errors {
		reverse_proxy 127.0.0.1:%d
	}
}
`, site, policy, policy, policy, policy, sim)+sims(sim))
			url := fmt.Sprintf("http://127.0.0.1:%d", site)
			setBackends(t, url, fmt.Sprintf("http://127.0.0.1:%d", dead))
			if o := complete(url); o.status != 200 || o.replica != fmt.Sprintf("sim-%d", sim) {
				t.Fatalf("the fallback did not answer (its body was read away): %+v", o)
			}
		})
	}
}

// A policy that routes without the prompt reads a small body whole before
// it picks (the headers and the body then go out in one write), but not
// where a handle_errors reverse_proxy may send the client's body again and
// no Sluice handler keeps it (static upstreams): reverse_proxy leaves the
// client's body unread after a dial error, and the fallback must get it.
// Ports 9600-9602.
func TestHandleErrorsFallbackGetsTheBodyOfAStaticPool(t *testing.T) {
	site, sim, dead := 9600, 9601, 9602 // nothing listens on dead
	startCaddy(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:%d {
		lb_policy queued_least_latency {
			pool hebody-static
		}
	}
	handle_errors {
		reverse_proxy 127.0.0.1:%d
	}
}
`, site, dead, sim)+sims(sim))
	url := fmt.Sprintf("http://127.0.0.1:%d", site)
	if o := complete(url); o.status != 200 || o.replica != fmt.Sprintf("sim-%d", sim) {
		t.Fatalf("the fallback did not answer (its body was read away): %+v", o)
	}
}

// reverse_proxy retries after a dial error; the retry must go to another
// replica (queued_least_latency sent it back to the one that failed: 502
// once max_fails let that replica stay up) and get the same body again (a
// policy that read the body to route by the prompt sent the body the
// failed attempt had closed: 502 on a healthy replica).
func TestRetryAfterADialErrorResendsTheBody(t *testing.T) {
	site, sim, dead := 9871, 9872, 9873 // nothing listens on dead
	for _, policy := range []string{"cache_aware", "load_aware", "queued_least_latency"} {
		t.Run(policy, func(t *testing.T) {
			startCaddy(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:%d 127.0.0.1:%d {
		lb_policy %s {
			pool retry-%s
			max_fails 1000
		}
		lb_retries 3
	}
}
`, site, dead, sim, policy, policy)+sims(sim))
			url := fmt.Sprintf("http://127.0.0.1:%d", site)
			for i := 0; i < 8; i++ {
				// A new prompt each time: no cache hit keeps the pick on the
				// live replica, so about half the first attempts dial the
				// dead one.
				body := fmt.Sprintf(`{"prompt":"question %d: %s","max_tokens":4}`, i, strings.Repeat("why ", i+1))
				resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Header.Get("X-Sim-Replica") != fmt.Sprintf("sim-%d", sim) {
					t.Fatalf("request %d: %d from %q", i, resp.StatusCode, resp.Header.Get("X-Sim-Replica"))
				}
			}
		})
	}
}

// Caddy's header and query policies call their fallback policy without a
// ResponseWriter: a Sluice fallback that refuses must not panic (it did,
// and the client lost the connection); reverse_proxy answers 503 itself.
func TestSluiceAsAnotherPolicysFallbackRefusesWithoutPanicking(t *testing.T) {
	startCaddy(t, globals+`
:9895 {
	bind 127.0.0.1
	route {
		custom_router fallback-pool
		reverse_proxy {
			dynamic custom_router fallback-pool
			lb_policy header X-Route {
				fallback queued_least_latency {
					pool fallback-pool
					state_log_interval -1
				}
			}
		}
	}
}
`)
	// The pool has no backends: the fallback refuses.
	o := complete("http://127.0.0.1:9895")
	if o.err != nil || o.status != 503 {
		t.Fatalf("%+v, want Caddy's 503", o)
	}
}

// A replica that accepts the request and never answers is abandoned after
// its first-byte limit (the client gets 504 instead of a hang) and marked
// down, so the next requests go elsewhere. It used to hold every request
// sent to it, and clients giving up counted as "cancelled", never failed.
func TestHungReplicaIsAbandonedAndMarkedDown(t *testing.T) {
	site, good, hung := 9901, 9902, 9903
	startCaddy(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	route {
		custom_router hung
		reverse_proxy {
			dynamic custom_router hung
			lb_policy queued_least_latency {
				pool hung
				parallelism 4
				first_byte_timeout 300ms
				fail_duration 1m
				state_log_interval -1
			}
		}
	}
}
:%d {
	bind 127.0.0.1
	inference_sim {
		name sim-%d
		latency fixed 20ms
		stall 1m 1
	}
}
`, site, hung, hung)+sims(good))
	url := fmt.Sprintf("http://127.0.0.1:%d", site)
	setBackends(t, url, fmt.Sprintf("http://127.0.0.1:%d", hung), fmt.Sprintf("http://127.0.0.1:%d", good))
	got504 := 0
	for i := 0; i < 6; i++ {
		o := complete(url)
		switch {
		case o.status == 504:
			got504++
		case o.status != 200 || o.replica != fmt.Sprintf("sim-%d", good):
			t.Fatalf("request %d: %+v", i, o)
		}
	}
	if got504 != 1 {
		t.Fatalf("%d requests timed out on the hung replica, want exactly 1 (then it is down)", got504)
	}
	for _, b := range getHealth(t, url).Backends {
		if b.Addr == fmt.Sprintf("127.0.0.1:%d", hung) && (!b.Down || b.Failures != 1) {
			t.Fatalf("the hung replica: %+v, want down after 1 failure", b)
		}
	}
	drained(t, url)
}

// Clients that announce a body and hang up before sending it used to make
// the proxy count its 502s against the replica, marking a healthy replica
// down. A truncated upload is the client's doing: the replica stays up.
func TestTruncatedUploadsDoNotMarkTheReplicaDown(t *testing.T) {
	site, sim := 9911, 9912
	startCaddy(t, globals+fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	route {
		custom_router truncated
		reverse_proxy {
			dynamic custom_router truncated
			lb_policy queued_least_latency {
				pool truncated
				fail_duration 1m
				state_log_interval -1
			}
		}
	}
}
`, site)+sims(sim))
	url := fmt.Sprintf("http://127.0.0.1:%d", site)
	setBackends(t, url, fmt.Sprintf("http://127.0.0.1:%d", sim))
	for i := 0; i < 8; i++ {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", site))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\":")
		time.Sleep(20 * time.Millisecond) // the proxy has started the upload
		c.Close()
	}
	eventually(t, "the truncated requests to end", func() bool { return inFlight(getHealth(t, url)) == 0 })
	for _, b := range getHealth(t, url).Backends {
		if b.Down || b.Failures != 0 {
			t.Fatalf("clients' truncated uploads were counted against the replica: %+v", b)
		}
	}
	if o := complete(url); o.status != 200 {
		t.Fatalf("the replica no longer serves: %+v", o)
	}
}
