package cacheaware

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCollector(t *testing.T) {
	r := newRouter(t, Config{MaxTreeSize: 10}, "a", "b")
	r.Insert("m", "0123456789", "a")
	r.Pick("m", "0123456789", nil) // hit
	r.Pick("m", "zz", nil)         // miss
	r.Insert("m", "abcdefgh", "b") // evicts the first text
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(func() map[string]*Router { return map[string]*Router{"p1": r} }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" && l.GetValue() != "p1" {
					t.Fatalf("pool label = %q", l.GetValue())
				}
				if l.GetName() == "reason" {
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
		"sluice_cache_aware_decisions_total/cache_hit": 1,
		"sluice_cache_aware_decisions_total/miss":      1,
		"sluice_cache_aware_decisions_total/imbalance": 0,
		"sluice_cache_aware_tree_chars":                8,
		"sluice_cache_aware_tree_nodes":                1,
		"sluice_cache_aware_evicted_chars_total":       10,
		"sluice_cache_aware_affinity_hits_total":       0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}
