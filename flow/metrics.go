package flow

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports every pool's flow control with the seed's metric names
// and labels (inference_extension_flow_control_*). Gauges are read from
// snapshots at scrape time, so a flow that drains simply stops being
// reported; histograms are fed through the Observer each controller gets
// from Observer(pool). Sluice's additions are sluice_flow_control_*.
type Collector struct {
	controllers func() map[string]*Controller

	queueDuration   *prometheus.HistogramVec
	enqueueDuration *prometheus.HistogramVec
	dispatchCycle   prometheus.Histogram

	queueSize, queueBytes, saturation *prometheus.Desc
	inFlight, requests                *prometheus.Desc

	// Client-chosen label values, bounded (see labels.go), and their
	// combinations in the queue-duration histogram.
	flowIDs, models labelSet
	series          seriesSet
}

var (
	queueLabels = []string{"fairness_id", "priority", "inference_pool", "model_name", "target_model_name"}
	fastBuckets = []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, .1}
)

// NewCollector reports the controllers returned by controllers (pool name
// → controller), read at each scrape.
func NewCollector(controllers func() map[string]*Controller) *Collector {
	const ns = "inference_extension_flow_control_"
	return &Collector{
		controllers: controllers,
		queueDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    ns + "request_queue_duration_seconds",
			Help:    "Time requests spend in the Flow Control layer, by outcome.",
			Buckets: []float64{.0001, .001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"}),
		enqueueDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    ns + "request_enqueue_duration_seconds",
			Help:    "Time taken to enqueue requests (admission: queued, dispatched at once, or rejected).",
			Buckets: fastBuckets,
		}, []string{"fairness_id", "priority", "outcome"}),
		dispatchCycle: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    ns + "dispatch_cycle_duration_seconds",
			Help:    "Time taken for each dispatch cycle over non-empty queues.",
			Buckets: fastBuckets,
		}),
		queueSize:  prometheus.NewDesc(ns+"queue_size", "Current number of requests in Flow Control.", queueLabels, nil),
		queueBytes: prometheus.NewDesc(ns+"queue_bytes", "Current size in bytes of requests in Flow Control.", queueLabels, nil),
		saturation: prometheus.NewDesc(ns+"pool_saturation", "Current saturation level of the pool (1 or more: dispatch halted).", []string{"inference_pool"}, nil),
		inFlight:   prometheus.NewDesc("sluice_flow_control_inflight_requests", "Requests dispatched by flow control and not yet finished.", []string{"inference_pool"}, nil),
		requests:   prometheus.NewDesc("sluice_flow_control_requests_total", "Requests that left flow control, by outcome.", []string{"inference_pool", "outcome"}, nil),
	}
}

// Observer returns the hooks pool's controller reports to.
func (c *Collector) Observer(pool string) Observer { return collectorObserver{c, pool} }

type collectorObserver struct {
	c    *Collector
	pool string
}

func (o collectorObserver) Enqueued(r *Request, outcome string, d time.Duration) {
	o.c.enqueueDuration.WithLabelValues(o.c.flowIDs.value(r.FlowID), strconv.Itoa(r.Priority), outcome).Observe(d.Seconds())
}

func (o collectorObserver) Finished(r *Request, out Outcome, waited time.Duration) {
	id, model, target := o.c.flowIDs.value(r.FlowID), o.c.models.value(r.Model), o.c.models.value(r.TargetModel)
	if !o.c.series.admit([3]string{id, model, target}) {
		// Past the bound a tenant's new models share one series: the
		// tenant keeps its own (at most MaxLabelValues+1 of those).
		model, target = OverflowLabel, OverflowLabel
	}
	o.c.queueDuration.WithLabelValues(id, strconv.Itoa(r.Priority), out.String(), o.pool,
		model, target).Observe(waited.Seconds())
}

func (o collectorObserver) DispatchCycle(d time.Duration) { o.c.dispatchCycle.Observe(d.Seconds()) }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.queueDuration.Describe(ch)
	c.enqueueDuration.Describe(ch)
	c.dispatchCycle.Describe(ch)
	for _, d := range []*prometheus.Desc{c.queueSize, c.queueBytes, c.saturation, c.inFlight, c.requests} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.queueDuration.Collect(ch)
	c.enqueueDuration.Collect(ch)
	c.dispatchCycle.Collect(ch)
	for pool, ctl := range c.controllers() {
		s := ctl.Snapshot()
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		gauge(c.saturation, s.Saturation, pool)
		gauge(c.inFlight, float64(s.InFlight.Requests), pool)
		for o, n := range map[Outcome]uint64{
			Dispatched: s.Counters.Dispatched, RejectedCapacity: s.Counters.RejectedCapacity,
			RejectedOther: s.Counters.RejectedOther, EvictedTTL: s.Counters.EvictedTTL,
			EvictedContextCancelled: s.Counters.EvictedContextCancelled, EvictedOther: s.Counters.EvictedOther,
		} {
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(n), pool, o.String())
		}
		// Sanitized and bounded labels can fold several flows into one
		// series: sum them, or the registry refuses the duplicates.
		type series struct{ id, prio, model, target string }
		queued, bytes := map[series]float64{}, map[series]float64{}
		for _, b := range s.Bands {
			prio := strconv.Itoa(b.Priority)
			for _, f := range b.Flows {
				for _, m := range f.Models {
					k := series{c.flowIDs.value(f.ID), prio, c.models.value(m.Model), c.models.value(m.TargetModel)}
					queued[k] += float64(m.Queued)
					bytes[k] += float64(m.Bytes)
				}
			}
		}
		for k, n := range queued {
			gauge(c.queueSize, n, k.id, k.prio, pool, k.model, k.target)
			gauge(c.queueBytes, bytes[k], k.id, k.prio, pool, k.model, k.target)
		}
	}
}
