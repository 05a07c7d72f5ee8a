package flow

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Each client-chosen label is bounded on its own (fairness ids come from
// the trusted tenant header, model names from any client's body), but the
// queue-duration histogram is labelled by both: 1000 tenants × 1000
// models made a million series, each a histogram kept for ever and
// written out at every scrape. The combinations are bounded too; past
// the bound a tenant's further models fold into OverflowLabel, so every
// tenant keeps its own series.
func TestQueueDurationSeriesAreBoundedAcrossLabels(t *testing.T) {
	col := NewCollector(func() map[string]*Controller { return nil })
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(col); err != nil {
		t.Fatal(err)
	}
	obs := col.Observer("pool")
	const tenants, models = 150, 150 // 22,500 combinations, each label well within its own bound
	for i := 0; i < tenants; i++ {
		for j := 0; j < models; j++ {
			obs.Finished(&Request{FlowID: fmt.Sprint("t", i), Model: fmt.Sprint("m", j)}, Dispatched, 0)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series, perTenant := 0, map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "inference_extension_flow_control_request_queue_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			series++
			perTenant[labels(m)["fairness_id"]] = true
		}
	}
	if max := MaxLabelSeries + tenants; series > max {
		t.Fatalf("%d queue-duration series for %d tenants × %d models, want at most %d", series, tenants, models, max)
	}
	if len(perTenant) != tenants {
		t.Fatalf("%d tenants have series, want all %d", len(perTenant), tenants)
	}
}
