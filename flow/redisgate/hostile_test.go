package redisgate

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redistest"
)

// A max_concurrency written as "no limit" (the largest int64) must not
// wrap the pool's limit negative: the claim script then entitled every
// instance to nothing and each request waited out its TTL.
func TestHugeMaxConcurrencyStillAdmits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		g, err := New(Config{Conn: tg.Conn, Pool: uniquePool(t), Instance: "i0"})
		if err != nil {
			t.Fatal(err)
		}
		fc := flow.Config{Detector: flow.DetectorConfig{Type: flow.DetectorConcurrency, MaxConcurrency: math.MaxInt64}}
		g.SetLocal(flow.NewConcurrencyDetector(fc.Detector, func() int { return 1 }))
		ctl, err := flow.New(fc, g, flow.PublishDemand(g.Feed()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ctl.Close(); g.Close() })
		// The deadline only keeps a broken gate from hanging the test.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tk, err := ctl.Enqueue(ctx, flow.Request{FlowID: "t"})
		if err != nil {
			t.Fatalf("request never admitted: %v (gate %+v)", err, g.Stats())
		}
		tk.Release()
	})
}
