package caddymodule

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb/qll"
)

// privateTLSEngine is a replica over TLS whose certificate no system root
// signed: it serves vLLM metrics, /tokenize and completions, counting the
// engine reads that reach it (a read gets there only through a TLS
// handshake that trusted its certificate). ca is a PEM file of its CA.
type privateTLSEngine struct {
	dial, ca          string
	metrics, tokenize atomic.Int64
}

func newPrivateTLSEngine(t *testing.T) *privateTLSEngine {
	t.Helper()
	e := &privateTLSEngine{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			e.metrics.Add(1)
			w.Write([]byte("vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.1\n" +
				`vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1` + "\n"))
		case "/tokenize":
			e.tokenize.Add(1)
			w.Write([]byte(`{"tokens":[1,2,3]}`))
		default:
			w.Write([]byte(`{"ok":true}`))
		}
	}))
	t.Cleanup(srv.Close)
	e.dial = strings.TrimPrefix(srv.URL, "https://")
	e.ca = writeCertPEM(t, "engine-ca.pem", srv.Certificate().Raw)
	return e
}

// writeCertPEM writes the certificate der as a PEM file in the test's
// directory and returns its path.
func writeCertPEM(t *testing.T, name string, der []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// unrelatedCAFile is a PEM file of a CA that signed no replica's certificate.
func unrelatedCAFile(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return writeCertPEM(t, "other-ca.pem", der)
}

// trustingRoute is a reverse_proxy route to dial over TLS trusting the CA
// in the PEM file ca (what `transport http { tls_trusted_ca_certs ca }`
// writes), picked by policy, with handlers before it.
func trustingRoute(dial, ca string, policy map[string]any, before ...map[string]any) map[string]any {
	proxy := map[string]any{
		"handler":   "reverse_proxy",
		"upstreams": []map[string]any{{"dial": dial}},
		"transport": map[string]any{"protocol": "http", "tls": map[string]any{"root_ca_pem_files": []string{ca}}},
	}
	if policy != nil {
		proxy["load_balancing"] = map[string]any{"selection_policy": policy}
	}
	return map[string]any{"handle": append(before, proxy)}
}

// awaitEngineRead polls cond; the deadline only bounds a broken build, no
// timing is asserted.
func awaitEngineRead(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Every engine read of a replica behind a reverse_proxy whose transport
// trusts a private CA trusts it too: queued_least_latency's, load_aware's
// and flow_control's metrics scrapes, cache_aware's KV cache size scrapes
// and its engine tokenizer's /tokenize. They trusted the system's roots
// alone, so every read of such a replica failed (seen only as a scrape
// error in health) and the policies fell back to weaker signals.
func TestEngineReadsTrustTheTransportsCA(t *testing.T) {
	for _, tc := range []struct {
		name     string
		route    func(e *privateTLSEngine, pool string) map[string]any
		tokenize bool
	}{
		{"queued_least_latency", func(e *privateTLSEngine, pool string) map[string]any {
			return trustingRoute(e.dial, e.ca, map[string]any{"policy": "queued_least_latency", "pool": pool,
				"state_log_interval": -1, "metrics_interval": "100ms"})
		}, false},
		{"load_aware", func(e *privateTLSEngine, pool string) map[string]any {
			return trustingRoute(e.dial, e.ca, map[string]any{"policy": "load_aware", "pool": pool, "metrics_interval": "100ms"})
		}, false},
		{"flow_control", func(e *privateTLSEngine, pool string) map[string]any {
			return trustingRoute(e.dial, e.ca, nil, map[string]any{"handler": "flow_control", "pool": pool,
				"detector": "utilization", "metrics_interval": "100ms"})
		}, false},
		{"cache_aware kv_events", func(e *privateTLSEngine, pool string) map[string]any {
			return trustingRoute(e.dial, e.ca, map[string]any{"policy": "cache_aware", "pool": pool,
				"kv_events": "tcp://" + freeKVAddr(t)})
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newPrivateTLSEngine(t)
			url := startProxy(t, []map[string]any{tc.route(e, freshPoolName("private-ca"))}, nil)
			if got := prompted(t, url, "a prompt to read the engine for"); got != http.StatusOK {
				t.Fatalf("through the upstream trusting its CA: status %d, want 200", got)
			}
			awaitEngineRead(t, "a metrics scrape trusted the replica's CA", func() bool { return e.metrics.Load() > 0 })
			if tc.tokenize {
				awaitEngineRead(t, "a /tokenize request trusted the replica's CA", func() bool { return e.tokenize.Load() > 0 })
			}
		})
	}
}

// awaitQLLSample waits for pool's queued_least_latency scraper to hold a
// sample of the replica at dial that ok accepts, and returns it.
func awaitQLLSample(t *testing.T, pool, dial, what string, ok func(err error) bool) error {
	t.Helper()
	var last error
	awaitEngineRead(t, what, func() bool {
		st := pickersOf[*qll.State]("queued_least_latency")[pool]
		if st == nil {
			return false
		}
		smp := st.Engine().Stats(dial).Sample
		last = smp.Err
		if smp.At.IsZero() && smp.Err == nil {
			return false // not scraped yet
		}
		return ok(smp.Err)
	})
	return last
}

// The scraper outlives reloads; its TLS settings follow the running
// config's transport: a reload that names another CA applies it (a new
// transport), one naming the replica's CA again too, and a refused reload
// changes nothing.
func TestEngineReadsFollowTheTLSBlockAcrossReloads(t *testing.T) {
	e := newPrivateTLSEngine(t)
	pool, wrong := freshPoolName("private-ca-reload"), unrelatedCAFile(t)
	policy := map[string]any{"policy": "queued_least_latency", "pool": pool, "state_log_interval": -1,
		"metrics_interval": "100ms"}
	url := startProxy(t, []map[string]any{trustingRoute(e.dial, e.ca, policy)}, nil)
	statusOf(t, completion(t, http.MethodPost, url))
	awaitQLLSample(t, pool, e.dial, "a scrape trusting the replica's CA", func(err error) bool { return err == nil })

	url = startProxy(t, []map[string]any{trustingRoute(e.dial, wrong, policy)}, nil)
	statusOf(t, completion(t, http.MethodPost, url))
	awaitQLLSample(t, pool, e.dial, "a scrape failing under the other CA", func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "certificate")
	})

	url = startProxy(t, []map[string]any{trustingRoute(e.dial, e.ca, policy)}, nil)
	statusOf(t, completion(t, http.MethodPost, url))
	awaitQLLSample(t, pool, e.dial, "a scrape trusting the replica's CA again", func(err error) bool { return err == nil })

	// Refused: the other CA, and a module after it that fails to provision.
	bad := map[string]any{"handle": []map[string]any{{"handler": "reverse_proxy", "upstreams": []map[string]any{{"dial": e.dial}},
		"load_balancing": map[string]any{"selection_policy": map[string]any{"policy": "queued_least_latency",
			"pool": freshPoolName("refused"), "queue_max_size": -5}}}}}
	routes := []map[string]any{trustingRoute(e.dial, wrong, policy), bad}
	if err := caddy.Load(refusedProxyConfig(t, routes), true); err == nil {
		t.Fatal("Caddy loaded a config with queue_max_size -5")
	}
	st := pickersOf[*qll.State]("queued_least_latency")[pool]
	if st == nil {
		t.Fatal("the running config's state is gone after a refused reload")
	}
	okBefore, failedBefore := st.Engine().Scrapes()
	awaitEngineRead(t, "three more scrapes", func() bool { ok, _ := st.Engine().Scrapes(); return ok >= okBefore+3 })
	if _, failed := st.Engine().Scrapes(); failed != failedBefore {
		t.Fatalf("after a refused reload naming another CA, %d scrapes failed: %v", failed-failedBefore, st.Engine().Stats(e.dial).Sample.Err)
	}
}

// refusedProxyConfig is startProxy's config of routes, for a load expected to be
// refused (it never listens).
func refusedProxyConfig(t *testing.T, routes []map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"apps":    map[string]any{"http": map[string]any{"servers": map[string]any{"proxy": map[string]any{"listen": []string{"127.0.0.1:0"}, "routes": routes}}}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
