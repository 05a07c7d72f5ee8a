package caddymodule

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/kvevents"
)

// tlsTokenizeReplica is a TLS engine answering /tokenize; it returns its
// dial address.
func tlsTokenizeReplica(t *testing.T) string {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"tokens":[1,2,3]}`))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "https://")
}

// tokenizeFailures waits for pool's engine tokenizer to have failed n
// times in all and returns its failures by reason. A TLS replica asked
// over plain HTTP answers 400 (Go's TLS server: a status failure); asked
// over TLS without the proxy's tls block, it is unreachable (its
// certificate is not one of the system's).
func tokenizeFailures(t *testing.T, pool string, n uint64) map[string]uint64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // bounds a request that never comes; no timing asserted
	for {
		s := kvListenerOf(t, pool).tokenizeStats()
		if s != nil {
			var sum uint64
			for _, c := range s.Failures {
				sum += c
			}
			if sum >= n {
				return maps.Clone(s.Failures)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: the engine tokenizer never failed %d times: %+v", pool, n, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kvTokenizeProxy is oneUpstreamRoute through cache_aware on pool with
// kv_events at listen.
func kvTokenizeProxy(pool, listen, dial string, tls bool) map[string]any {
	return oneUpstreamRoute(dial, tls, map[string]any{"policy": "cache_aware", "pool": pool, "kv_events": listen})
}

// prompted sends a completion of prompt through the proxy at url and
// returns its status.
func prompted(t *testing.T, url, prompt string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"`+prompt+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	return statusOf(t, req)
}

// cache_aware with kv_events asks a static upstream the proxy reaches over
// TLS for /tokenize over TLS: asked at http://dial, it answered 400 to
// every request and the exact index never had the engine's ids. The
// policy's state outlives reloads: the scheme follows the transport's.
func TestKVTokenizeStaticTLSUpstreamOverTLS(t *testing.T) {
	dial := tlsTokenizeReplica(t)
	pool, listen := freshPoolName("kv-tokenize-static-tls"), "tcp://"+freeKVAddr(t)
	// Without a tls block the proxy and the tokenizer both use plain HTTP
	// (a 400 does not mark the replica down for the tokenizer).
	url := startProxy(t, []map[string]any{kvTokenizeProxy(pool, listen, dial, false)}, nil)
	prompted(t, url, "a first prompt")
	if f := tokenizeFailures(t, pool, 1); f[kvevents.TokStatus] != 1 {
		t.Fatalf("plain HTTP to the TLS replica: failures %v, want its 400 (status)", f)
	}

	url = startProxy(t, []map[string]any{kvTokenizeProxy(pool, listen, dial, true)}, nil)
	if got := prompted(t, url, "a second prompt"); got != http.StatusOK {
		t.Fatalf("through the TLS upstream: status %d, want 200", got)
	}
	// Over TLS with the transport's tls block (insecure_skip_verify), as
	// the proxy's own request went: the ids are stored, nothing fails.
	deadline := time.Now().Add(20 * time.Second) // bounds a request that never comes; no timing asserted
	for s := kvListenerOf(t, pool).tokenizeStats(); s == nil || s.Stored < 1; s = kvListenerOf(t, pool).tokenizeStats() {
		if time.Now().After(deadline) {
			t.Fatalf("the TLS replica's /tokenize never answered through the proxy's tls block: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if f := kvListenerOf(t, pool).tokenizeStats().Failures; f[kvevents.TokStatus] != 1 || len(f) != 1 {
		t.Fatalf("failures %v after /tokenize over TLS, want only the earlier plain-HTTP 400 (%s)", f, kvevents.TokStatus)
	}
}

// The same with a managed backend set: the replica's URL says https.
func TestKVTokenizeManagedTLSBackendOverTLS(t *testing.T) {
	dial := tlsTokenizeReplica(t)
	pool := freshPoolName("kv-tokenize-managed-tls")
	bs, err := lb.ParseBackends([]string{"https://" + dial})
	if err != nil {
		t.Fatal(err)
	}
	lb.GetPool(pool).Set(bs)
	p := &CacheAware{Pool: pool, kvEventsOptions: kvEventsOptions{KVEvents: "tcp://" + freeKVAddr(t)}}
	if err := p.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Cleanup() })
	pk := pickersOf[*cacheaware.Picker]("cache_aware")[pool]
	if pk == nil {
		t.Fatalf("no cache_aware picker for pool %s", pool)
	}
	pickKV(t, pk, "a prompt to tokenize")
	if f := tokenizeFailures(t, pool, 1); f[kvevents.TokUnreachable] != 1 {
		t.Fatalf("the TLS replica was asked for /tokenize over plain HTTP (it answers 400 there): failures %v, want one %s (over TLS, its certificate untrusted)", f, kvevents.TokUnreachable)
	}
}
