package redisgate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redistest"
)

// TestHeldHashLostAloneGrantsNoMoreThanCapacity: the hash of held units
// dropped alone (maxmemory evicted it, an operator's DEL) while a's 4
// requests fill the pool of 4, the other keys intact. The next instance
// to ask was granted as if the pool were idle (no epoch or claim count
// told: meta stayed), until a's renewal wrote its units back. The claim
// must see the loss, report it (OnRepair), and grant no one more until
// every holder has renewed; a's units are counted again at its renewal.
func TestHeldHashLostAloneGrantsNoMoreThanCapacity(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		const capacity = 4
		pool := uniquePool(t)
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor(tg.Conn.KeyPrefix, pool)
		var mu sync.Mutex
		var notes []string
		// A renewal every 2s: a lease that b's first claims fall within.
		tune := func(c *Config) {
			c.LeaseTTL = 6 * time.Second
			c.OnRepair = func(n int64, what string) {
				mu.Lock()
				notes = append(notes, what)
				mu.Unlock()
			}
		}
		a := newInstance(t, tg.Conn, pool, "a", capacity, tune)
		b := newInstance(t, tg.Conn, pool, "b", capacity, tune)
		var running []*flow.Ticket
		for range capacity {
			running = append(running, admitWithin(t, a, 5*time.Second))
		}
		eventually(t, "a holds the pool", func() bool { return poolHeld(t, cl, k) == capacity })

		mustDo(t, cl, cl.B().Del().Key(k.Held).Build())

		// Over a's next renewal and more, b gets nothing: a's 4 still run.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if tk, err := b.ctl.Enqueue(ctx, flow.Request{FlowID: "t"}); err == nil {
			tk.Release()
			t.Fatalf("b admitted after the held hash was lost while a's %d requests fill the pool of %d (gate a %+v, b %+v)",
				capacity, capacity, a.gate.Stats(), b.gate.Stats())
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if got := poolHeld(t, cl, k); got != capacity {
			t.Errorf("after a's renewal Redis records %d units held; a has %d in flight", got, capacity)
		}
		mu.Lock()
		reported := strings.Join(notes, "; ")
		mu.Unlock()
		if !strings.Contains(reported, k.Held) {
			t.Errorf("the loss was not reported naming %s: repairs %q", k.Held, reported)
		}
		// Released and acquired as before: nothing drifted.
		running[0].Release()
		admitWithin(t, b, 5*time.Second).Release()
		for _, tk := range running[1:] {
			tk.Release()
		}
		eventually(t, "the pool given back", func() bool { return poolHeld(t, cl, k) == 0 })
	})
}
