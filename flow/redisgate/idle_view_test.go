package redisgate

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// An instance gone idle while another still holds units keeps its view of
// the pool (pool_held, instances: what its metrics and health show) within
// a renewal of the truth: it asks again until the pool is idle too. It
// used to sleep an hour on its last claim, so an idle instance showed the
// others' units held long after they were given back.
func TestIdleInstanceSeesThePoolGoIdle(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{redistest.Addr(t)}}
	pool := uniquePool(t)
	quickRenewal := func(c *Config) { c.LeaseTTL = time.Second }
	a := newInstance(t, conn, pool, "a", 4, quickRenewal)
	b := newInstance(t, conn, pool, "b", 4, quickRenewal)
	var bs []*flow.Ticket
	for range 2 {
		tk, err := b.ctl.Enqueue(context.Background(), flow.Request{})
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, tk)
	}
	ta, err := a.ctl.Enqueue(context.Background(), flow.Request{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a sees b's 2 and its own 1 held", func() bool { return a.gate.Stats().PoolHeld == 3 },
		func() any { return a.gate.Stats() })
	ta.Release()
	eventually(t, "a gives its unit back", func() bool { return a.gate.Stats().Held == 0 },
		func() any { return a.gate.Stats() })
	for _, tk := range bs {
		tk.Release()
	}
	eventually(t, "idle a sees the pool idle", func() bool { return a.gate.Stats().PoolHeld == 0 },
		func() any { return a.gate.Stats() }, func() any { return b.gate.Stats() })
}
