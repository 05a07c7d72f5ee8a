package redisgate

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redistest"
)

// Two fairness ids with one FNV-64a hash, found offline in minutes (a rho
// search over 11-character ids): a client that sets its own id can pick
// one that collides with another tenant's.
const collidingA, collidingB = "hnYrQSsED4F", "R6yT0mORKDC"

// A tenant whose id collides with another's under a weak hash is still
// its own flow across instances: a flood under the colliding id must not
// take its victim's share.
func TestCollidingIDsKeepTheirOwnShares(t *testing.T) {
	fa, fb := fnv.New64a(), fnv.New64a()
	fa.Write([]byte(collidingA))
	fb.Write([]byte(collidingB))
	if fa.Sum64() != fb.Sum64() {
		t.Fatalf("the ids do not collide under FNV-64a: %x, %x", fa.Sum64(), fb.Sum64())
	}
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor("", uniquePool(t))
		ctx := context.Background()
		q := func(tenant string) flow.FlowDemand {
			return flow.FlowDemand{FlowID: tenant, Queued: flow.InFlight{Requests: 10}}
		}
		do := func(inst string, demand ...flow.FlowDemand) *flow.FlowShares {
			t.Helper()
			names := map[string]string{}
			for _, d := range demand {
				names[flowName(d.FlowID)] = d.FlowID
			}
			r, err := claim(ctx, cl, k, inst, 0, 10*int64(len(demand)), encodeDemand(demand, false), 6, time.Minute, seen{})
			if err != nil {
				t.Fatal(err)
			}
			return parseShares(r.shares, names, false)
		}
		// Capacity 6 over three tenants: 2 each. The victim waits at a;
		// the collider and a third tenant at b.
		do("a", q(collidingA))
		do("b", q(collidingB), q("C"))
		if got := do("a", q(collidingA)).Of[flow.FlowKey{FlowID: collidingA}]; got != 2 {
			t.Fatalf("%s's share at a is %v, want 2 of 6 (three tenants)", collidingA, got)
		}
		if got := do("b", q(collidingB), q("C")).Of; got[flow.FlowKey{FlowID: collidingB}] != 2 || got[flow.FlowKey{FlowID: "C"}] != 2 {
			t.Fatalf("shares at b %v, want 2 each", got)
		}
	})
}

// BenchmarkFlowNames is what naming flows costs a claim: its demand and
// the names its shares come back under, for a typical and a large number
// of tenants waiting at one instance.
//
//	go test -run XXX -bench FlowNames -benchmem ./flow/redisgate/
func BenchmarkFlowNames(b *testing.B) {
	b.Run("one", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			flowName("tenant-0123456789")
		}
	})
	for _, tenants := range []int{8, 1000} {
		var flows []flow.FlowDemand
		for i := range tenants {
			flows = append(flows, flow.FlowDemand{FlowID: fmt.Sprintf("tenant-%d", i), Queued: flow.InFlight{Requests: 1}})
		}
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				encodeDemand(flows, false)
				names := map[string]string{}
				for _, f := range flows {
					names[flowName(f.FlowID)] = f.FlowID
				}
			}
		})
	}
}
