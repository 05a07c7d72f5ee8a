package redisleast

import (
	"context"
	"testing"

	"github.com/sluice-router/sluice/lb/redistest"
)

// QueueDepth reads the pool's queue from Redis (every instance's waiters)
// and counts this instance's own.
func TestQueueDepthReadsRedis(t *testing.T) { redistest.Each(t, testQueueDepthReadsRedis) }

func testQueueDepthReadsRedis(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x", "y")
	x, y := st[0], st[1]
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan got, 3)
	enqueue(t, ctx, c, y, "y1", out, "r")
	enqueue(t, ctx, c, y, "y2", out, "r")
	enqueue(t, ctx, c, x, "x1", out, "r")
	for _, w := range []struct {
		s       *Store
		waiting int
	}{{x, 1}, {y, 2}} {
		d, queueing := w.s.QueueDepth(context.Background())
		if !queueing || d.Err != nil || d.Queued != 3 || d.Waiting != w.waiting {
			t.Errorf("%s: QueueDepth %+v (queueing %v), want 3 queued, %d waiting here, no error", w.s.ident.Load().id, d, queueing, w.waiting)
		}
	}
	cancel()
	for range 3 {
		<-out
	}
	held.Release(ok)
	if d, _ := x.QueueDepth(context.Background()); d.Err != nil || d.Queued != 0 || d.Waiting != 0 {
		t.Errorf("QueueDepth %+v once the waiters left, want none queued", d)
	}

	plain := newStore(t, confFor(t, tg), "p")
	if d, queueing := plain.QueueDepth(context.Background()); queueing {
		t.Errorf("QueueDepth of a store not queueing: %+v, ok; want not ok", d)
	}
}

// Redis gone, QueueDepth says why (within the store's ReadTimeout), and
// still counts this instance's waiters.
func TestQueueDepthRedisGone(t *testing.T) {
	srv := privateRedis(t)
	s := newStore(t, queueConfig(t, srv.Addr), "p")
	srv.Kill()
	d, queueing := s.QueueDepth(context.Background())
	if !queueing || d.Err == nil || d.Queued != -1 || d.Waiting != 0 {
		t.Errorf("QueueDepth %+v (queueing %v) with Redis gone: want an error, -1 queued, 0 waiting", d, queueing)
	}
}
