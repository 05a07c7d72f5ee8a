package caddymodule

import (
	"reflect"
	"testing"

	"github.com/sluice-router/sluice/lb/streamrelay"
)

// The pool's relay stats (health and the sluice_kv_events_relay_*
// metrics) add up every counter of its relays: a counter left out reads
// 0 for ever (resets did, after it was added to the relay's stats).
func TestKVRelayStatsAddUpEveryCounter(t *testing.T) {
	one := streamrelay.Stats{Connected: true}
	v := reflect.ValueOf(&one).Elem()
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Uint64:
			f.SetUint(1)
		case reflect.Int, reflect.Int64:
			f.SetInt(1)
		}
	}
	sum := reflect.ValueOf(sumRelayStats([]streamrelay.Stats{one, one}))
	for i := range sum.NumField() {
		name := sum.Type().Field(i).Name
		want := int64(2)
		if name == "LagMillis" { // the largest, not a sum
			want = 1
		}
		switch f := sum.Field(i); f.Kind() {
		case reflect.Uint64:
			if int64(f.Uint()) != want {
				t.Errorf("%s: %d, want %d", name, f.Uint(), want)
			}
		case reflect.Int, reflect.Int64:
			if f.Int() != want {
				t.Errorf("%s: %d, want %d", name, f.Int(), want)
			}
		}
	}
}
