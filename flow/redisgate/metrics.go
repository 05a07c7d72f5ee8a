package redisgate

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the gates returned by gates (pool → gate), read at
// each scrape.
type Collector struct {
	gates                                                  func() map[string]*Gate
	allowed, held, entitled, poolHeld, capacity, instances *prometheus.Desc
	fallback, claims, errors                               *prometheus.Desc
}

// NewCollector reports the gates returned by gates.
func NewCollector(gates func() map[string]*Gate) *Collector {
	pool := []string{"inference_pool"}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("sluice_flow_control_global_"+name, help, pool, nil)
	}
	return &Collector{
		gates:     gates,
		allowed:   d("allowed", "Units (requests, or tokens in tokens mode) this instance may have in flight now: its share of the pool."),
		held:      d("held", "Units Redis counts for this instance (above allowed while requests beyond its share finish)."),
		entitled:  d("entitled", "This instance's fair share of the pool at the last claim."),
		poolHeld:  d("pool_held", "Units held by every instance of the pool together, at the last claim."),
		capacity:  d("capacity", "The pool's capacity in units (max_concurrency × replicas)."),
		instances: d("instances", "Instances of the pool holding or wanting a share, at the last claim."),
		fallback:  d("fallback", "1 while Redis is away and this instance dispatches against its fallback share."),
		claims:    d("claims_total", "Claims this instance made in Redis."),
		errors:    d("redis_errors_total", "Redis calls of the gate that failed."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.allowed, c.held, c.entitled, c.poolHeld, c.capacity, c.instances, c.fallback, c.claims, c.errors} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for pool, g := range c.gates() {
		s := g.Stats()
		fb := 0.0
		if s.Fallback {
			fb = 1
		}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, pool)
		}
		gauge(c.allowed, float64(s.Allowed))
		gauge(c.held, float64(s.Held))
		gauge(c.entitled, float64(s.Entitled))
		gauge(c.poolHeld, float64(s.PoolHeld))
		gauge(c.capacity, float64(s.Capacity))
		gauge(c.instances, float64(s.Instances))
		gauge(c.fallback, fb)
		ch <- prometheus.MustNewConstMetric(c.claims, prometheus.CounterValue, float64(s.Claims), pool)
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(s.RedisErrors), pool)
	}
}
