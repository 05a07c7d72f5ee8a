package loadaware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// A replica's metrics are outside input. One that answers its /metrics
// with a redirect to another server (a proxy in front of it, a
// misconfigured or compromised replica) must not be ranked on that
// server's load: here an idle one, which drew every request to it while
// an honest replica with 3 waiting stood by.
func TestAReplicaRedirectingItsMetricsElsewhereIsNotRankedOnThem(t *testing.T) {
	idle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"))
	}))
	defer idle.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running 8\nvllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.5\n"))
	}))
	defer busy.Close()
	away := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, idle.URL+"/metrics", http.StatusFound)
	}))
	defer away.Close()
	var set []lb.Backend
	for _, srv := range []*httptest.Server{busy, away} {
		u, _ := url.Parse(srv.URL)
		set = append(set, lb.Backend{Dial: u.Host, URL: srv.URL})
	}
	p := NewPicker(PickerConfig{Policy: Config{Weights: map[string]float64{Queue: 1, KVCache: 1}},
		Metrics: modelmetrics.Config{Interval: time.Hour}})
	p.SetBackends(set)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	for _, b := range set {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if smp, f := p.Scraper().Get(b.Dial); f != modelmetrics.Unknown && (f == modelmetrics.Fresh || smp.Err != nil) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never scraped", b.Dial)
			}
		}
	}
	for range 4 {
		l, err := p.Pick(ctx, &lb.Request{Tokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		got := l.Replica()
		l.Release(lb.Outcome{Kind: lb.Success})
		if got != set[0].Dial {
			smp, f := p.Scraper().Get(set[1].Dial)
			t.Fatalf("picked the redirecting replica %s (its metrics: %v %+v) over the honest one with 3 waiting", got, f, smp)
		}
	}
}
