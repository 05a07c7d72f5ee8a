package qll

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports every pool's queue and replica statistics. It reads
// snapshots at scrape time, so a replica removed from the set simply stops
// being reported: no stale series to delete. The seed's custom_router_*
// names are kept (with an added pool label); Sluice's additions are sluice_*.
type Collector struct {
	states func() map[string]*State
	wait   *prometheus.HistogramVec

	queueDepth, ewma, inflight, down     *prometheus.Desc
	slots                                *prometheus.Desc
	dispatched, evicted, timedOut        *prometheus.Desc
	cancelled, refused, failures, bFails *prometheus.Desc
}

// NewCollector reports the states returned by states (pool name → state).
func NewCollector(states func() map[string]*State) *Collector {
	pool := []string{"pool"}
	addr := []string{"pool", "addr"}
	return &Collector{
		states: states,
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_queue_wait_seconds",
			Help:    "Time requests waited in the queued_least_latency queue before dispatch.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1200},
		}, pool),
		queueDepth: prometheus.NewDesc("custom_router_queue_depth", "Requests currently waiting in the queue.", pool, nil),
		ewma:       prometheus.NewDesc("custom_router_backend_ewma_latency_seconds", "EWMA latency per replica.", addr, nil),
		inflight:   prometheus.NewDesc("custom_router_backend_inflight_requests", "In-flight requests per replica.", addr, nil),
		slots:      prometheus.NewDesc("sluice_backend_slots", "Requests a replica takes before new ones wait at the edge: pinned (parallelism) or learned.", addr, nil),
		down:       prometheus.NewDesc("sluice_backend_down", "1 while a replica is marked down after failures.", addr, nil),
		dispatched: prometheus.NewDesc("custom_router_requests_dispatched_total", "Requests forwarded to a replica.", pool, nil),
		evicted:    prometheus.NewDesc("custom_router_requests_evicted_total", "Requests dropped because the queue was full.", pool, nil),
		timedOut:   prometheus.NewDesc("custom_router_requests_timeout_total", "Requests dropped after waiting queue_timeout.", pool, nil),
		cancelled:  prometheus.NewDesc("sluice_requests_cancelled_total", "Queued requests whose client left before dispatch.", pool, nil),
		refused:    prometheus.NewDesc("sluice_requests_refused_total", "Requests refused without queueing (no backends, queueing disabled, shutdown).", pool, nil),
		failures:   prometheus.NewDesc("sluice_requests_failed_total", "Dispatched attempts that ended in a transport error or a 5xx.", pool, nil),
		bFails:     prometheus.NewDesc("sluice_backend_failures_total", "Failed attempts per replica.", addr, nil),
	}
}

// WaitObserver returns the function a pool's State reports queue waits to.
func (c *Collector) WaitObserver(pool string) func(time.Duration) {
	h := c.wait.WithLabelValues(pool)
	return func(d time.Duration) { h.Observe(d.Seconds()) }
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.wait.Describe(ch)
	for _, d := range []*prometheus.Desc{c.queueDepth, c.ewma, c.inflight, c.slots, c.down, c.dispatched,
		c.evicted, c.timedOut, c.cancelled, c.refused, c.failures, c.bFails} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.wait.Collect(ch)
	for pool, s := range c.states() {
		snap := s.Snapshot()
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		counter := func(d *prometheus.Desc, v uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
		}
		gauge(c.queueDepth, float64(snap.QueueDepth), pool)
		counter(c.dispatched, snap.Counters.Dispatched, pool)
		counter(c.evicted, snap.Counters.Evicted, pool)
		counter(c.timedOut, snap.Counters.TimedOut, pool)
		counter(c.cancelled, snap.Counters.Cancelled, pool)
		counter(c.refused, snap.Counters.Refused, pool)
		counter(c.failures, snap.Counters.Failures, pool)
		for _, r := range snap.Replicas {
			gauge(c.ewma, r.EWMASeconds, pool, r.Addr)
			gauge(c.inflight, float64(r.InFlight), pool, r.Addr)
			gauge(c.slots, float64(r.Parallelism), pool, r.Addr)
			down := 0.0
			if r.Down {
				down = 1
			}
			gauge(c.down, down, pool, r.Addr)
			counter(c.bFails, r.Failures, pool, r.Addr)
		}
	}
}
