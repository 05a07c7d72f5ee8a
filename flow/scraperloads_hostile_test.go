package flow

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// A replica's metrics are outside input. Whatever a broken, hostile or
// foreign replica answers, the utilization detector must score it as
// full (1: it never opens the gate for a saturated pool) and never as
// something the gate rule cannot read (NaN, ±Inf).
func TestHostileReplicaMetricsScoreAsFull(t *testing.T) {
	idle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"))
	}))
	defer idle.Close()
	bodies := map[string]string{
		"/nan":      "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 0\n",
		"/neg":      "vllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc 0\n",
		"/inf":      "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc +Inf\n",
		"/ninf":     "vllm:num_requests_waiting -Inf\n",
		"/overflow": "vllm:num_requests_waiting{e=\"0\"} 1e308\nvllm:num_requests_waiting{e=\"1\"} 1e308\n",
		"/html":     "<html><body>vllm:num_requests_waiting is 0</body></html>\n",
		"/running":  "vllm:num_requests_running 0\n", // neither waiting nor KV use
	}
	mux := http.NewServeMux()
	for path, body := range bodies {
		mux.HandleFunc(path+"/metrics", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(body)) })
	}
	// Another host's idle metrics are not this replica's.
	mux.HandleFunc("/away/metrics", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, idle.URL+"/metrics", http.StatusFound)
	})
	mux.HandleFunc("/full/metrics", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_waiting 5\nvllm:kv_cache_usage_perc 0.5\n"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	targets := map[string]string{"full": srv.URL + "/full"}
	for path := range bodies {
		targets[path] = srv.URL + path
	}
	targets["/away"] = srv.URL + "/away"
	s := modelmetrics.New(modelmetrics.Config{Interval: time.Hour, Timeout: time.Minute})
	s.SetTargets(targets)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for addr := range targets {
		eventually(t, addr+" scraped", func() bool { st := s.Stats(addr); return st.Freshness == modelmetrics.Fresh || st.Sample.Err != nil })
	}
	for addr := range targets {
		if addr == "full" {
			continue
		}
		// The pool: a replica at its queue threshold and the hostile one.
		pool := []string{"full", addr}
		d := NewUtilizationDetector(DetectorConfig{}, ScraperLoads(s, func() []string { return pool }), nil)
		load := d.Saturation(InFlight{}).Load
		st := s.Stats(addr)
		if math.IsNaN(load) || math.IsInf(load, 0) || load != 1 {
			t.Errorf("%s (%v, %+v): pool load %v, want 1 (the hostile replica scores as full)", strings.TrimPrefix(addr, "/"), st.Freshness, st.Sample, load)
		}
	}
}
