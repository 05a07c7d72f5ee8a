package caddymodule

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// A sample older than metrics_staleness is ignored, and a replica is read
// every metrics_interval: a staleness under the interval made every
// sample stale for part of each interval, and the policy flapped between
// the engine's figures and its fallback. Such a config is refused, naming
// the directive; the default interval (1 s) counts when none is set.
func TestMetricsStalenessUnderTheIntervalIsRefused(t *testing.T) {
	d := func(s string) caddy.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return caddy.Duration(v)
	}
	type module interface{ Validate() error }
	for _, c := range []struct {
		name            string
		interval, stale string
		refused         bool
	}{
		{"under the interval", "2s", "1s", true},
		{"under the default interval", "", "500ms", true},
		{"equal to the interval", "1s", "1s", false},
		{"three intervals", "1s", "3s", false},
		{"staleness unset", "5s", "", false},
	} {
		var iv, st caddy.Duration
		if c.interval != "" {
			iv = d(c.interval)
		}
		if c.stale != "" {
			st = d(c.stale)
		}
		for name, m := range map[string]module{
			"queued_least_latency": &QueuedLeastLatency{MetricsInterval: iv, MetricsStaleness: st},
			"load_aware":           &LoadAware{MetricsInterval: iv, MetricsStaleness: st},
			"flow_control":         &FlowControl{MetricsInterval: iv, MetricsStaleness: st, Detector: "utilization"},
		} {
			err := m.Validate()
			if c.refused && (err == nil || !strings.Contains(err.Error(), name+": metrics_staleness")) {
				t.Errorf("%s, %s (interval %q, staleness %q): %v, want refused naming %s: metrics_staleness", name, c.name, c.interval, c.stale, err, name)
			}
			if !c.refused && err != nil {
				t.Errorf("%s, %s (interval %q, staleness %q): refused: %v", name, c.name, c.interval, c.stale, err)
			}
		}
	}
}
