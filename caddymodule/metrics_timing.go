package caddymodule

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// checkMetricsTiming refuses a metrics_staleness under the interval at
// which the replicas are read (metrics_interval, or the scraper's default):
// every sample would then be stale for part of each interval, and the
// policy would flap between the engine's own figures and its fallback.
func checkMetricsTiming(module string, interval, staleness caddy.Duration) error {
	if staleness <= 0 {
		return nil // unset: a multiple of the interval
	}
	iv := time.Duration(interval)
	if iv <= 0 {
		iv = modelmetrics.Config{}.WithDefaults().Interval
	}
	if time.Duration(staleness) < iv {
		return fmt.Errorf("%s: metrics_staleness: %v is under the interval the replicas are read at (metrics_interval %v): every sample would go stale between two reads",
			module, time.Duration(staleness), iv)
	}
	return nil
}
