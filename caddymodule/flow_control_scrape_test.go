package caddymodule

import (
	"testing"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// flow_control reads the replicas' metrics only for the utilization
// detector. With the concurrency detector (Caddy's default) it scraped
// every replica's /metrics every interval all the same: load on the
// replicas for a reading nothing used. With the utilization detector the
// replicas' scraped metrics show in health, where a replica whose broken
// metrics hold the pool's gate can be seen.
func TestFlowControlScrapesOnlyForTheUtilizationDetector(t *testing.T) {
	replicas := []lb.Backend{{Dial: "127.0.0.1:19301", URL: "http://127.0.0.1:19301"}, {Dial: "127.0.0.1:19302", URL: "http://127.0.0.1:19302"}}
	concurrency := flow.Config{Detector: flow.DetectorConfig{Type: flow.DetectorConcurrency}}
	utilization := flow.Config{Detector: flow.DetectorConfig{Type: flow.DetectorUtilization}}
	st, err := newFlowState("scrape-test", concurrency, modelmetrics.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Destruct()
	st.setFixed(0, replicas)
	if n := len(st.scraper.Snapshot()); n != 0 {
		t.Errorf("concurrency detector: %d replicas scraped, want none", n)
	}
	if st.Health().Metrics != nil {
		t.Error("concurrency detector: health shows replica metrics nothing reads")
	}
	// A reload to the utilization detector scrapes them, and shows them.
	if err := st.configure(utilization, modelmetrics.Config{}); err != nil {
		t.Fatal(err)
	}
	if n := len(st.scraper.Snapshot()); n != 2 {
		t.Errorf("utilization detector: %d replicas scraped, want 2", n)
	}
	if st.Health().Metrics != st.scraper {
		t.Error("utilization detector: health does not show the replicas' scraped metrics")
	}
	// And back.
	if err := st.configure(concurrency, modelmetrics.Config{}); err != nil {
		t.Fatal(err)
	}
	if n := len(st.scraper.Snapshot()); n != 0 {
		t.Errorf("back to the concurrency detector: %d replicas scraped, want none", n)
	}
}
