package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/qll"
)

// oneUpstreamRoute is a reverse_proxy route to the upstream at dial, over
// TLS with tls (as `to https://dial` writes it: the HTTP transport with a
// tls block), picked by the selection policy given.
func oneUpstreamRoute(dial string, tls bool, policy map[string]any) map[string]any {
	transport := map[string]any{"protocol": "http"}
	if tls {
		transport["tls"] = map[string]any{"insecure_skip_verify": true}
	}
	return map[string]any{"handle": []map[string]any{{
		"handler":        "reverse_proxy",
		"upstreams":      []map[string]any{{"dial": dial}},
		"transport":      transport,
		"load_balancing": map[string]any{"selection_policy": policy},
	}}}
}

// tlsQLLProxy is oneUpstreamRoute through queued_least_latency on pool,
// its engine metrics on.
func tlsQLLProxy(pool, dial string, tls bool) map[string]any {
	return oneUpstreamRoute(dial, tls, map[string]any{"policy": "queued_least_latency", "pool": pool, "state_log_interval": -1})
}

// scrapeErrorOf waits for pool's queued_least_latency scraper to have
// tried the replica at dial and returns the error it got.
func scrapeErrorOf(t *testing.T, pool, dial, want string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // bounds a scrape that never comes; no timing asserted
	last := ""
	for {
		if st := pickersOf[*qll.State]("queued_least_latency")[pool]; st != nil {
			if err := st.Engine().Stats(dial).Sample.Err; err != nil {
				last = err.Error()
				if strings.Contains(last, want) {
					return last
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: no scrape of %s at %s (last error: %q)", pool, dial, want, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A static upstream the proxy reaches over TLS has its engine metrics read
// over TLS: scraped at http://dial, a TLS replica answers no metrics and
// queued_least_latency lost its engine signals (the learned limit alone
// then held requests at the edge). A reload that drops the tls block goes
// back to http://, where the TLS replica answers 400. (The scrape trusts
// what the transport trusts: here nothing is verified.)
func TestStaticTLSUpstreamsEngineMetricsAreReadOverTLS(t *testing.T) {
	var overTLS atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			overTLS.Add(1)
			w.Write([]byte("vllm:num_requests_waiting 0\n"))
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(srv.Close)
	dial := strings.TrimPrefix(srv.URL, "https://")
	pool := "static-tls-" + t.Name()

	url := startProxy(t, []map[string]any{tlsQLLProxy(pool, dial, true)}, nil)
	if got := statusOf(t, completion(t, http.MethodPost, url+"/v1/completions")); got != http.StatusOK {
		t.Fatalf("through the TLS upstream: status %d, want 200", got)
	}
	deadline := time.Now().Add(20 * time.Second) // bounds a scrape that never comes; no timing asserted
	for {
		st := pickersOf[*qll.State]("queued_least_latency")[pool]
		if st != nil && overTLS.Load() > 0 {
			if smp := st.Engine().Stats(dial).Sample; !smp.At.IsZero() && smp.Err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: no metrics read over TLS from %s (%d reads reached it)", pool, dial, overTLS.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}

	// The same upstream, now without TLS: the scrape follows the reload.
	url = startProxy(t, []map[string]any{tlsQLLProxy(pool, dial, false)}, nil)
	statusOf(t, completion(t, http.MethodPost, url+"/v1/completions"))
	scrapeErrorOf(t, pool, dial, "http://"+dial+"/metrics")
}
