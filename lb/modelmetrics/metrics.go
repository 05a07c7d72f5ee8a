package modelmetrics

import "github.com/prometheus/client_golang/prometheus"

// Collector exports every pool's scraper statistics. Like qll's, it reads
// snapshots at scrape time, so removed targets simply stop being reported.
type Collector struct {
	scrapers            func() map[string]*Scraper
	scrapes, age, fresh *prometheus.Desc
}

// NewCollector reports the scrapers returned by scrapers (pool name → scraper).
func NewCollector(scrapers func() map[string]*Scraper) *Collector {
	return &Collector{
		scrapers: scrapers,
		scrapes: prometheus.NewDesc("sluice_model_metrics_scrapes_total",
			"Scrapes of replicas' model-server metrics, by result (ok, error).", []string{"pool", "result"}, nil),
		age: prometheus.NewDesc("sluice_model_metrics_age_seconds",
			"Seconds since a replica's model-server metrics were last read successfully.", []string{"pool", "addr"}, nil),
		fresh: prometheus.NewDesc("sluice_model_metrics_fresh",
			"1 while a replica's model-server metrics are fresh, 0 when stale or not yet read.", []string{"pool", "addr"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.scrapes
	ch <- c.age
	ch <- c.fresh
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for pool, s := range c.scrapers() {
		ok, failed := s.Scrapes()
		ch <- prometheus.MustNewConstMetric(c.scrapes, prometheus.CounterValue, float64(ok), pool, "ok")
		ch <- prometheus.MustNewConstMetric(c.scrapes, prometheus.CounterValue, float64(failed), pool, "error")
		now := s.now()
		for _, t := range s.Snapshot() {
			if !t.Sample.At.IsZero() { // never read: no age to report
				age := max(now.Sub(t.Sample.At), 0).Seconds()
				ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age, pool, t.Addr)
			}
			fresh := 0.0
			if t.Freshness == Fresh {
				fresh = 1
			}
			ch <- prometheus.MustNewConstMetric(c.fresh, prometheus.GaugeValue, fresh, pool, t.Addr)
		}
	}
}
