package qll

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// tlsMetricsReplica is an https replica (https://127.0.0.1:port) serving
// a vLLM-style metrics body at any path, counting its scrapes per path.
type tlsMetricsReplica struct {
	*httptest.Server
	mu   sync.Mutex
	hits map[string]int
}

func newTLSMetricsReplica(t *testing.T) *tlsMetricsReplica {
	m := &tlsMetricsReplica{hits: map[string]int{}}
	m.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.hits[r.URL.Path]++
		m.mu.Unlock()
		fmt.Fprint(w, "vllm:num_requests_waiting 2\nvllm:num_requests_running 5\nvllm:kv_cache_usage_perc 0.25\n")
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *tlsMetricsReplica) scrapes(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hits[path]
}

// engineSeen reports whether qll's own view of replica addr took a sample
// that exports the engine's queue (what decides its slots).
func engineSeen(s *State, addr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.replicas[addr]
	return r != nil && r.eng.wantsSample()
}

// freshEngineSample waits for a fresh sample of addr in s's scraper and
// for qll's engine view of it; it fails with the scrape's own error.
func freshEngineSample(t *testing.T, s *State, addr, what string) modelmetrics.Sample {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := s.Engine().Stats(addr)
		if st.Freshness == modelmetrics.Fresh && engineSeen(s, addr) {
			return st.Sample
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no fresh engine sample of %s (freshness %v, %d failed scrapes, last error: %v)",
				what, addr, st.Freshness, st.ConsecutiveFailures, st.Sample.Err)
		}
		time.Sleep(time.Millisecond)
	}
}

// A replica of a managed backend set named https://host:port has its
// engine metrics read at that URL, as load_aware reads them, not at
// http://host:port: there a TLS replica answers no metrics and the
// engine signals were silently lost (admission fell back to the learned
// limit alone). A reload keeps the URL.
func TestEngineMetricsOfAnHTTPSReplicaAreReadAtItsURL(t *testing.T) {
	srv := newTLSMetricsReplica(t)
	addr := strings.TrimPrefix(srv.URL, "https://")
	// srv.Client() trusts the test server's certificate.
	cfg := Config{EngineMetrics: modelmetrics.Config{Interval: time.Hour, Client: srv.Client()}}
	s := New(cfg)
	runEngine(t, s)
	s.SetBackends([]lb.Backend{{URL: srv.URL, Dial: addr}})

	smp := freshEngineSample(t, s, addr, "the first scrape")
	if smp.Waiting != 2 || smp.Running != 5 {
		t.Fatalf("sample waiting %v running %v, want 2 and 5", smp.Waiting, smp.Running)
	}

	// A reload (here one that moves the metrics path) re-targets the
	// scraper: still at the replica's https URL.
	cfg.EngineMetrics.Path = "/v1/metrics"
	s.Configure(cfg)
	freshEngineSample(t, s, addr, "after the reload")
	if n := srv.scrapes("/v1/metrics"); n == 0 {
		t.Fatalf("no scrape at the reloaded path")
	}
}
