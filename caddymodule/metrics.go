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

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/flow/redisgate"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/cacheaware/share"
	"github.com/sluice-router/sluice/lb/loadaware"
	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/qll"
	"github.com/sluice-router/sluice/lb/redisleast"
)

// One collector per process reads every live pool state at scrape time.
// It is registered on each config's metrics registry (the one Caddy serves
// at admin /metrics and through the metrics handler) as that config loads,
// and on a private registry served at /_custom_router/metrics.
var (
	qllCollector = qll.NewCollector(func() map[string]*qll.State {
		return pickersOf[*qll.State]("queued_least_latency")
	})
	cacheAwareCollector = cacheaware.NewCollector(func() map[string]*cacheaware.Router {
		return mapped(pickersOf[*cacheaware.Picker]("cache_aware"), (*cacheaware.Picker).Router)
	})
	scraperCollector = modelmetrics.NewCollector(func() map[string]*modelmetrics.Scraper {
		return mapped(pickersOf[*loadaware.Picker]("load_aware"), (*loadaware.Picker).Scraper)
	})
	redisCollector = redisleast.NewCollector(func() map[string]*redisleast.Store {
		return pickersOf[*redisleast.Store]("global_redis_least")
	})
	cacheShareCollector = share.NewCollector(func() map[string]*share.Sharer {
		out := map[string]*share.Sharer{}
		for pool, pk := range pickersOf[*cacheaware.Picker]("cache_aware") {
			if s, ok := cacheAwareSharers.Load(pk); ok {
				out[pool] = s.(*share.Sharer)
			}
		}
		return out
	})
	flowCollector     = flow.NewCollector(flowControllers)
	flowGateCollector = redisgate.NewCollector(flowGates)
	sluiceCollectors  = []prometheus.Collector{qllCollector, cacheAwareCollector, cacheShareCollector, scraperCollector, redisCollector, flowCollector, flowGateCollector}
	sluiceMetrics     = func() *prometheus.Registry {
		r := prometheus.NewRegistry()
		r.MustRegister(sluiceCollectors...)
		return r
	}()
	sluiceMetricsHandler = promhttp.HandlerFor(sluiceMetrics, promhttp.HandlerOpts{})
)

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
