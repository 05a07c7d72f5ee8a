package redisleast

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-router/sluice/lb"
)

func TestCollectorExportsStoreStats(t *testing.T) {
	s := newStore(t, testConfig(t, testRedis(t)), "p")
	if err := s.Sync(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	l := sel(t, s, "a", "b")
	if _, err := s.Counts(context.Background()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func() map[string]*Store { return map[string]*Store{"p": s} }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "addr" {
					name += "/" + lp.GetValue()
				}
			}
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[name] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"sluice_redis_selections_total": 1, "sluice_redis_releases_total": 0, "sluice_redis_fallbacks_total": 0,
		"sluice_redis_set_mismatch_picks_total": 0,
		"sluice_redis_shed_total":               0, "sluice_redis_errors_total": 0, "sluice_redis_breaker_open": 0,
		"sluice_redis_inflight/" + l.Addr: 1,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if got["sluice_redis_script_seconds"] < 3 { // renew, sync, counts, select, counts
		t.Errorf("script histogram count %v", got["sluice_redis_script_seconds"])
	}
	l.Release(lb.Outcome{Kind: lb.Success})
}
