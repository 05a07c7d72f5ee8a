package caddymodule

import (
	"errors"
	"net/http"

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
