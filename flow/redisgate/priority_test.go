package redisgate

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redistest"
)

// Every priority a band or objective may have keeps its shares across
// instances. Redis's Lua printed priorities of 1e14 and beyond as floats
// ("1e+14"), whose shares the gate could not read back, and merged
// priorities that differ by less than a float's precision into one band.
func TestEveryPriorityKeepsItsShares(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		cl := redistest.Client(t, tg.Conn)
		ctx := context.Background()
		shares := func(capacity int64, demand ...flow.FlowDemand) map[flow.FlowKey]float64 {
			t.Helper()
			names := map[string]string{}
			for _, d := range demand {
				names[flowName(d.FlowID)] = d.FlowID
			}
			r, err := claim(ctx, cl, KeysFor("", uniquePool(t)), "i", 0, int64(len(demand)), encodeDemand(demand, false), capacity, time.Minute, seen{})
			if err != nil {
				t.Fatal(err)
			}
			return parseShares(r.shares, names, false).Of
		}
		one := func(prio int, tenant string) flow.FlowDemand {
			return flow.FlowDemand{Priority: prio, FlowID: tenant, Queued: flow.InFlight{Requests: 1}}
		}
		for _, p := range []int{100, -10, 99_999_999_999_999, 1e14, -1e14, 123_456_789_012_345, 1 << 53, math.MaxInt64, math.MinInt64} {
			key := flow.FlowKey{Priority: p, FlowID: "t"}
			if got := shares(1, one(p, "t")); got[key] != 1 {
				t.Errorf("priority %d: shares %v, want 1 for %v", p, got, key)
			}
		}
		// Bands beyond a float's precision are still apart, and the higher
		// is served first.
		for _, p := range []int{1<<62 + 1, math.MaxInt64, math.MinInt64 + 1, 999_999_999_999_999_999 + 1} {
			hi, lo := flow.FlowKey{Priority: p, FlowID: "hi"}, flow.FlowKey{Priority: p - 1, FlowID: "lo"}
			if got := shares(1, one(p-1, "lo"), one(p, "hi")); got[hi] != 1 || got[lo] != 0 {
				t.Errorf("priorities %d and %d: shares %v, want all to the higher", p, p-1, got)
			}
		}
	})
}
