package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// A replica whose metrics scrapes fail shows how many failed in a row and
// when the backed-off scraper tries again; a healthy one shows neither.
func TestHealthMetricsShowTheScrapeBackoff(t *testing.T) {
	bad := httptest.NewServer(http.NotFoundHandler())
	defer bad.Close()
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_waiting 0\nvllm:num_requests_running 1\n"))
	}))
	defer good.Close()
	sc := modelmetrics.New(modelmetrics.Config{Interval: time.Hour})
	sc.SetTargets(map[string]string{"bad": bad.URL, "good": good.URL})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); sc.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for sc.Stats("bad").ConsecutiveFailures == 0 || sc.Stats("good").Freshness != modelmetrics.Fresh {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the first scrapes")
		}
		time.Sleep(2 * time.Millisecond)
	}

	b, err := json.Marshal(scrapedMetrics(sc, "bad"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Freshness           string   `json:"freshness"`
		Error               string   `json:"error"`
		ConsecutiveFailures int      `json:"consecutive_failures"`
		NextScrapeSeconds   *float64 `json:"next_scrape_seconds"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	// The first failure's wait is one Interval: an hour.
	if m.Freshness != "stale" || m.Error == "" || m.ConsecutiveFailures != 1 || m.NextScrapeSeconds == nil ||
		*m.NextScrapeSeconds < 3000 || *m.NextScrapeSeconds > 3600 {
		t.Fatalf("failing replica's metrics: %s", b)
	}
	g := scrapedMetrics(sc, "good")
	if g.ConsecutiveFailures != 0 || g.NextScrapeSeconds != nil || g.Freshness != "fresh" {
		t.Fatalf("healthy replica's metrics: %+v", g)
	}
}
