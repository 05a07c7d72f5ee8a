package caddymodule

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Each module has one collector per process (or a few) that reads every
// live pool state of the module at scrape time. A module registers them
// from its own file (registerCollectors, in its init); they are served on
// a private registry at /_custom_router/metrics, and registered on each
// config's metrics registry (the one Caddy serves at admin /metrics and
// through the metrics handler) as that config loads.
var (
	sluiceCollectors     []prometheus.Collector
	sluiceMetrics        = prometheus.NewRegistry()
	sluiceMetricsHandler = promhttp.HandlerFor(sluiceMetrics, promhttp.HandlerOpts{})
)

// registerCollectors adds a module's collectors. Call it from an init
// function: the list is read, never written, once requests are served.
func registerCollectors(cs ...prometheus.Collector) {
	sluiceCollectors = append(sluiceCollectors, cs...)
	sluiceMetrics.MustRegister(cs...)
}

func registerMetrics(ctx caddy.Context, log *zap.Logger) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range sluiceCollectors {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				log.Warn("cannot register Sluice metrics", zap.Error(err))
			}
		}
	}
}

func serveMetrics(w http.ResponseWriter, r *http.Request) {
	sluiceMetricsHandler.ServeHTTP(w, r)
}
