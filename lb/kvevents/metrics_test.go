package kvevents

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCollector(t *testing.T) {
	ix := NewIndex(Config{})
	storeChain(t, ix, "a", topicA, 1, 1, nil, seqTokens(0, 32), 16)
	storeChain(t, ix, "a", topicA, 3, 5, uint64(99), seqTokens(0, 16), 16) // a gap, then an unknown parent
	ix.CountDrop(ReasonMalformed)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(func() map[string][]Source { return map[string][]Source{"p1": {{Index: ix}}} }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" || l.GetName() == "replica" {
					key += "/" + l.GetValue()
				}
			}
			if c := m.GetCounter(); c != nil {
				got[key] = c.GetValue()
			} else {
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{
		"sluice_kv_events_batches_total":                  2,
		"sluice_kv_events_events_total":                   1, // the unknown parent's event is a drop
		"sluice_kv_events_gaps_total":                     1,
		"sluice_kv_events_restarts_total":                 0,
		"sluice_kv_events_dropped_total/malformed":        1,
		"sluice_kv_events_dropped_total/unknown_parent":   1,
		"sluice_kv_events_blocks/a":                       0,
		"sluice_kv_events_capacity_evicted_total":         0,
		"sluice_kv_events_last_event_timestamp_seconds/a": float64(t0.Unix()),
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}
