package flow

import (
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	c := Config{Bands: []BandConfig{{Priority: 100}, {Priority: -10, TTL: time.Second, MaxRequests: 50}}}.WithDefaults()
	if c.DefaultTTL != 60*time.Second || c.PollInterval != 50*time.Millisecond || c.MaxBytes != 0 || c.MaxRequests != 0 {
		t.Fatalf("globals %+v", c)
	}
	b := c.Bands[0]
	if b.Name != "priority-100" || b.MaxRequests != 0 || b.MaxBytes != 1_000_000_000 ||
		b.Fairness != "round_robin" || b.Ordering != "fcfs" || b.TTL != 60*time.Second {
		t.Fatalf("band defaults %+v", b)
	}
	if b := c.Bands[1]; b.TTL != time.Second || b.MaxRequests != 50 {
		t.Fatalf("band overrides lost: %+v", b)
	}
	d := c.Detector
	if d.Type != "utilization" || d.MaxConcurrency != 100 || d.ConcurrencyMode != "requests" ||
		d.MaxTokenConcurrency != 1_000_000 || d.QueueDepthThreshold != 5 || d.KVCacheThreshold != 0.8 || d.Headroom != 0 {
		t.Fatalf("detector defaults %+v", d)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// An unconfigured priority gets a default band.
	if u := c.band(7); u.Priority != 7 || u.MaxRequests != 0 || u.Fairness != "round_robin" || u.TTL != time.Minute {
		t.Fatalf("unconfigured band %+v", u)
	}
}

func TestConfigValidateNamesTheField(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{MaxRequests: -1}, "max_requests"},
		{Config{MaxBytes: -1}, "max_bytes"},
		{Config{DefaultTTL: -time.Second}, "default_ttl"},
		{Config{PollInterval: -1}, "poll_interval"},
		{Config{Bands: []BandConfig{{Priority: 1}, {Priority: 2, MaxBytes: -5}}}, "bands[1].max_bytes"},
		{Config{Bands: []BandConfig{{MaxRequests: -5}}}, "bands[0].max_requests"},
		{Config{Bands: []BandConfig{{TTL: -1}}}, "bands[0].ttl"},
		{Config{Bands: []BandConfig{{Priority: 3}, {Priority: 3}}}, "bands[1].priority"},
		{Config{Bands: []BandConfig{{Fairness: "lottery"}}}, "bands[0].fairness"},
		{Config{Bands: []BandConfig{{Ordering: "lifo"}}}, "bands[0].ordering"},
		{Config{Detector: DetectorConfig{Type: "magic"}}, "detector.type"},
		{Config{Detector: DetectorConfig{MaxConcurrency: -1}}, "detector.max_concurrency"},
		{Config{Detector: DetectorConfig{ConcurrencyMode: "bytes"}}, "detector.concurrency_mode"},
		{Config{Detector: DetectorConfig{MaxTokenConcurrency: -1}}, "detector.max_token_concurrency"},
		{Config{Detector: DetectorConfig{Headroom: 1.5}}, "detector.headroom"},
		{Config{Detector: DetectorConfig{QueueDepthThreshold: -1}}, "detector.queue_depth_threshold"},
		{Config{Detector: DetectorConfig{KVCacheThreshold: 1.2}}, "detector.kv_cache_threshold"},
		{Config{Detector: DetectorConfig{MetricsStaleness: -1}}, "detector.metrics_staleness"},
		{Config{Objectives: Objectives{"": 5}}, "objectives"},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want+":") {
			t.Errorf("Validate(%+v) = %v, want an error starting %q", tc.cfg, err, tc.want+":")
		}
	}
}

func TestObjectives(t *testing.T) {
	o := Objectives{"premium-traffic": 100, "standard-traffic": 0, "best-effort-traffic": -10}
	for name, want := range map[string]int{
		"premium-traffic": 100, "best-effort-traffic": -10, "standard-traffic": 0,
		"": 0, "unknown": 0,
	} {
		if got := o.Priority(name); got != want {
			t.Errorf("Priority(%q) = %d, want %d", name, got, want)
		}
	}
	if got := Objectives(nil).Priority("premium-traffic"); got != 0 {
		t.Errorf("nil map: %d", got)
	}
}
