package flow

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestCollectorSeedMetrics(t *testing.T) {
	c := newController(t, Config{Bands: []BandConfig{{Priority: 0, MaxRequests: 2}}}, slots(1))
	col := NewCollector(func() map[string]*Controller { return map[string]*Controller{"pool-a": c} })
	c.SetObserver(col.Observer("pool-a"))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(col); err != nil {
		t.Fatal(err)
	}

	held, _ := c.Enqueue(context.Background(), Request{FlowID: "t1", Model: "m", TargetModel: "m-lora"})
	out := make(chan result, 4)
	enqueueAsync(context.Background(), c, Request{FlowID: "t1", Bytes: 30, Model: "m", TargetModel: "m-lora"}, out)
	enqueueAsync(context.Background(), c, Request{FlowID: "t2", Bytes: 12, Model: "m"}, out)
	waitQueued(t, c, 2)
	if _, err := c.Enqueue(context.Background(), Request{FlowID: "t3"}); !errors.Is(err, ErrCapacity) {
		t.Fatal(err)
	}
	// A queued request's enqueue duration is observed after the
	// controller's lock is let go, a moment after it shows in the queue.
	eventually(t, "both queued requests' enqueue durations", func() bool {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "inference_extension_flow_control_request_enqueue_duration_seconds" {
				continue
			}
			var n uint64
			for _, m := range mf.GetMetric() {
				if labels(m)["outcome"] == "Queued" {
					n += m.GetHistogram().GetSampleCount()
				}
			}
			return n == 2
		}
		return false
	})

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf
	}
	want := map[string]dto.MetricType{
		"inference_extension_flow_control_request_queue_duration_seconds":   dto.MetricType_HISTOGRAM,
		"inference_extension_flow_control_queue_size":                       dto.MetricType_GAUGE,
		"inference_extension_flow_control_queue_bytes":                      dto.MetricType_GAUGE,
		"inference_extension_flow_control_dispatch_cycle_duration_seconds":  dto.MetricType_HISTOGRAM,
		"inference_extension_flow_control_request_enqueue_duration_seconds": dto.MetricType_HISTOGRAM,
		"inference_extension_flow_control_pool_saturation":                  dto.MetricType_GAUGE,
		"sluice_flow_control_inflight_requests":                             dto.MetricType_GAUGE,
		"sluice_flow_control_requests_total":                                dto.MetricType_COUNTER,
	}
	for name, typ := range want {
		mf := got[name]
		if mf == nil {
			t.Errorf("missing %s", name)
			continue
		}
		if mf.GetType() != typ {
			t.Errorf("%s: type %v, want %v", name, mf.GetType(), typ)
		}
	}

	// queue_size: one series per flow and model pair, with the seed's labels.
	sizes := map[string]float64{}
	for _, m := range got["inference_extension_flow_control_queue_size"].GetMetric() {
		l := labels(m)
		if l["inference_pool"] != "pool-a" || l["priority"] != "0" {
			t.Errorf("labels %v", l)
		}
		sizes[l["fairness_id"]+"/"+l["model_name"]+"/"+l["target_model_name"]] = m.GetGauge().GetValue()
	}
	if len(sizes) != 2 || sizes["t1/m/m-lora"] != 1 || sizes["t2/m/"] != 1 {
		t.Errorf("queue_size series %v", sizes)
	}
	for _, m := range got["inference_extension_flow_control_queue_bytes"].GetMetric() {
		if l := labels(m); l["fairness_id"] == "t1" && m.GetGauge().GetValue() != 30 {
			t.Errorf("queue_bytes t1 = %v", m.GetGauge().GetValue())
		}
	}
	if v := got["inference_extension_flow_control_pool_saturation"].GetMetric()[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("pool_saturation %v, want 1 (one slot, one in flight)", v)
	}
	outcomes := map[string]uint64{}
	for _, m := range got["inference_extension_flow_control_request_queue_duration_seconds"].GetMetric() {
		outcomes[labels(m)["outcome"]] += m.GetHistogram().GetSampleCount()
	}
	if outcomes["Dispatched"] != 1 || outcomes["RejectedCapacity"] != 1 {
		t.Errorf("queue duration outcomes %v", outcomes)
	}
	enq := map[string]uint64{}
	for _, m := range got["inference_extension_flow_control_request_enqueue_duration_seconds"].GetMetric() {
		enq[labels(m)["outcome"]] += m.GetHistogram().GetSampleCount()
	}
	if enq["Queued"] != 2 || enq["Dispatched"] != 1 || enq["RejectedCapacity"] != 1 {
		t.Errorf("enqueue duration outcomes %v", enq)
	}

	held.Release()
	(<-out).ticket.Release()
	(<-out).ticket.Release()
	mfs, _ = reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "inference_extension_flow_control_queue_size" && len(mf.GetMetric()) != 0 {
			t.Errorf("drained flows still reported: %v", mf.GetMetric())
		}
	}
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}
