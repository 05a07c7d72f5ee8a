package share

import "github.com/prometheus/client_golang/prometheus"

// Collector exports every pool's sharing counters and Redis state, read
// at scrape time.
type Collector struct {
	sharers                                  func() map[string]*Sharer
	published, applied, dropped, lag, conned *prometheus.Desc
	resets, oversize                         *prometheus.Desc
}

// NewCollector reports the sharers returned by sharers (pool → sharer).
func NewCollector(sharers func() map[string]*Sharer) *Collector {
	pool := []string{"pool"}
	return &Collector{
		sharers:   sharers,
		published: prometheus.NewDesc("sluice_cache_aware_share_published_total", "Routing decisions this instance published on the pool's Redis stream.", pool, nil),
		applied:   prometheus.NewDesc("sluice_cache_aware_share_applied_total", "Other instances' routing decisions applied to this instance's tree.", pool, nil),
		dropped:   prometheus.NewDesc("sluice_cache_aware_share_dropped_total", "Routing decisions dropped unpublished (buffer full while Redis was slow or away).", pool, nil),
		lag:       prometheus.NewDesc("sluice_cache_aware_share_lag_seconds", "Age of the last applied decision when it was applied.", pool, nil),
		conned:    prometheus.NewDesc("sluice_cache_aware_share_connected", "1 while the pool's Redis stream answers.", pool, nil),
		resets: prometheus.NewDesc("sluice_cache_aware_share_resets_total",
			"Times the pool's Redis stream was found reset under this instance's reader (deleted, emptied, or its ids below the last one read) and read again from its start.", pool, nil),
		oversize: prometheus.NewDesc("sluice_cache_aware_share_oversize_total",
			"Records read from the pool's Redis stream and skipped for their size (over the record bound or 64 fields, or a reply over 16 MiB alone).", pool, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.published, c.applied, c.dropped, c.lag, c.conned, c.resets, c.oversize} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for pool, s := range c.sharers() {
		st := s.Stats()
		conn := 0.0
		if st.Connected {
			conn = 1
		}
		ch <- prometheus.MustNewConstMetric(c.published, prometheus.CounterValue, float64(st.Published), pool)
		ch <- prometheus.MustNewConstMetric(c.applied, prometheus.CounterValue, float64(st.Applied), pool)
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.Dropped), pool)
		ch <- prometheus.MustNewConstMetric(c.resets, prometheus.CounterValue, float64(st.Resets), pool)
		ch <- prometheus.MustNewConstMetric(c.oversize, prometheus.CounterValue, float64(st.Oversize), pool)
		ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(st.LagMillis)/1000, pool)
		ch <- prometheus.MustNewConstMetric(c.conned, prometheus.GaugeValue, conn, pool)
	}
}
