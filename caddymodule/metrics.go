package caddymodule

import (
	"errors"
	"net/http"
	"sort"
	"strings"

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

// MetricNames returns the name of every metric Sluice's collectors
// describe, sorted (histograms by their base name, without _bucket, _sum
// and _count). The docs tests check docs/metrics.md and the Grafana
// dashboard against it.
func MetricNames() []string {
	ch := make(chan *prometheus.Desc, 256)
	go func() {
		for _, c := range sluiceCollectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	seen := map[string]bool{}
	for d := range ch {
		// Desc keeps its name unexported; its String form starts with
		// Desc{fqName: "<name>", ...}.
		s := d.String()
		if _, rest, ok := strings.Cut(s, `fqName: "`); ok {
			if name, _, ok := strings.Cut(rest, `"`); ok {
				seen[name] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
