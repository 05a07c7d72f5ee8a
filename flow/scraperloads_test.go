package flow

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// TestScraperLoadsFeedsUtilization runs a real modelmetrics.Scraper against
// two HTTP servers exporting vLLM metrics and checks the detector's verdict
// follows them.
func TestScraperLoadsFeedsUtilization(t *testing.T) {
	var waiting atomic.Int64
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("vllm:num_requests_waiting 9\nvllm:kv_cache_usage_perc 0.95\n"))
	}))
	defer busy.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("vllm:num_requests_waiting " + strconv.FormatInt(waiting.Load(), 10) + "\nvllm:kv_cache_usage_perc 0.1\n"))
	}))
	defer other.Close()
	addr := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

	s := modelmetrics.New(modelmetrics.Config{Interval: 5 * time.Millisecond, Staleness: time.Minute})
	s.SetTargets(map[string]string{addr(busy): busy.URL, addr(other): other.URL})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	replicas := []string{addr(busy), addr(other), "10.0.0.1:9"} // the last is not scraped: unknown
	d := NewUtilizationDetector(DetectorConfig{}, ScraperLoads(s, func() []string { return replicas }), nil)
	// Until both have been scraped once they read Unknown (score 1), and the
	// verdicts below would not follow their metrics.
	loads := ScraperLoads(s, nil)
	eventually(t, "both replicas scraped", func() bool {
		return loads.Load(addr(busy)).Fresh && loads.Load(addr(other)).Fresh
	})
	// busy scores 1.8 (9 waiting / 5), unknown 1, other 0: mean 0.93.
	eventually(t, "the idle replica to open the gate", func() bool { return !saturated(d.Saturation(InFlight{}).Load) })
	waiting.Store(5) // other now at its queue threshold: every replica saturated
	eventually(t, "the gate to close", func() bool { return saturated(d.Saturation(InFlight{}).Load) })

	l := loads.Load(addr(busy))
	if !l.Fresh || !l.HaveWaiting || !l.HaveKVCache || l.Waiting != 9 || l.KVCacheUsage != 0.95 {
		t.Fatalf("load %+v", l)
	}
}
