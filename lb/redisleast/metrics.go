package redisleast

import "github.com/prometheus/client_golang/prometheus"

// Collector exports every pool's Store statistics, read at scrape time.
// sluice_redis_inflight comes from the last Counts or Sync (the caller
// refreshes it, e.g. from its health endpoint): scraping never touches
// Redis.
type Collector struct {
	stores func() map[string]*Store

	selections, releases, fallbacks, mismatches, viewPicks, shed, errs, reclaimed *prometheus.Desc
	pending, breakerOpen, inflight, script                                        *prometheus.Desc
	// queueing mode only
	queued, waiting, queueTimeouts, queueCancels, handovers, queueWait *prometheus.Desc
}

// NewCollector reports the stores returned by stores (pool name → store).
func NewCollector(stores func() map[string]*Store) *Collector {
	pool := []string{"pool"}
	return &Collector{
		stores:      stores,
		selections:  prometheus.NewDesc("sluice_redis_selections_total", "Leases handed out by global_redis_least, Redis or fallback.", pool, nil),
		releases:    prometheus.NewDesc("sluice_redis_releases_total", "Leases released.", pool, nil),
		fallbacks:   prometheus.NewDesc("sluice_redis_fallbacks_total", "Selections made from local counts because Redis was unavailable.", pool, nil),
		mismatches:  prometheus.NewDesc("sluice_redis_set_mismatch_picks_total", "Selections made from local counts because none of the candidates was a member of the pool in Redis: another instance synced a backend set that shares no replica with this instance's.", pool, nil),
		viewPicks:   prometheus.NewDesc("sluice_redis_view_picks_total", "Selections made from this instance's view of the global counts because its Redis calls were at call_rate (sent to Redis with the next batch).", pool, nil),
		shed:        prometheus.NewDesc("sluice_redis_shed_total", "Requests refused because every candidate was at max_inflight.", pool, nil),
		errs:        prometheus.NewDesc("sluice_redis_errors_total", "Failed Redis calls (transport errors and timeouts).", pool, nil),
		reclaimed:   prometheus.NewDesc("sluice_redis_reclaimed_total", "Requests of dead instances reclaimed by this instance.", pool, nil),
		pending:     prometheus.NewDesc("sluice_redis_pending_releases", "Releases waiting for Redis to come back.", pool, nil),
		breakerOpen: prometheus.NewDesc("sluice_redis_breaker_open", "1 while the Redis circuit breaker is open.", pool, nil),
		inflight:    prometheus.NewDesc("sluice_redis_inflight", "Global in-flight requests per replica, as last read from Redis.", []string{"pool", "addr"}, nil),
		script:      prometheus.NewDesc("sluice_redis_script_seconds", "Latency of Redis calls made by global_redis_least.", pool, nil),

		queued:        prometheus.NewDesc("sluice_redis_queue_length", "Requests waiting in the pool's global queue (all instances), as last read from Redis.", pool, nil),
		waiting:       prometheus.NewDesc("sluice_redis_queue_waiting", "This instance's requests waiting in the global queue now.", pool, nil),
		queueTimeouts: prometheus.NewDesc("sluice_redis_queue_timeouts_total", "Requests refused after waiting queue_timeout in the global queue.", pool, nil),
		queueCancels:  prometheus.NewDesc("sluice_redis_queue_cancels_total", "Queued requests whose client gave up.", pool, nil),
		handovers:     prometheus.NewDesc("sluice_redis_queue_handovers_total", "Queued requests handed a slot by the global queue.", pool, nil),
		queueWait:     prometheus.NewDesc("sluice_redis_queue_wait_seconds", "Time queued requests waited for their slot.", pool, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.selections, c.releases, c.fallbacks, c.mismatches, c.viewPicks, c.shed, c.errs,
		c.reclaimed, c.pending, c.breakerOpen, c.inflight, c.script,
		c.queued, c.waiting, c.queueTimeouts, c.queueCancels, c.handovers, c.queueWait} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for pool, s := range c.stores() {
		st := s.Stats()
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), pool)
		}
		counter(c.selections, st.Selections)
		counter(c.releases, st.Releases)
		counter(c.fallbacks, st.Fallbacks)
		counter(c.mismatches, st.Mismatches)
		counter(c.viewPicks, st.ViewPicks)
		counter(c.shed, st.Shed)
		counter(c.errs, st.Errors)
		counter(c.reclaimed, st.Reclaimed)
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.Pending), pool)
		open := 0.0
		if st.Breaker == Open {
			open = 1
		}
		ch <- prometheus.MustNewConstMetric(c.breakerOpen, prometheus.GaugeValue, open, pool)
		for addr, n := range st.InFlight {
			ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(n), pool, addr)
		}
		buckets := make(map[float64]uint64, len(st.Buckets))
		for i, ub := range st.Buckets {
			buckets[ub] = st.BucketCounts[i]
		}
		ch <- prometheus.MustNewConstHistogram(c.script, st.ScriptCount, st.ScriptSum, buckets, pool)
		if !st.Queueing {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(st.Queued), pool)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(st.Waiting), pool)
		counter(c.queueTimeouts, st.QueueTimeouts)
		counter(c.queueCancels, st.QueueCancels)
		counter(c.handovers, st.Handovers)
		wb := make(map[float64]uint64, len(st.WaitBuckets))
		for i, ub := range st.WaitBuckets {
			wb[ub] = st.WaitBucketCounts[i]
		}
		ch <- prometheus.MustNewConstHistogram(c.queueWait, st.WaitCount, st.WaitSum, wb, pool)
	}
}
