package redisleast

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// A request waits in the queue with its own candidates: the replicas of
// its instance's pool (less those excluded or down). The queue is shared
// by every instance, and the member set in Redis is the last one any of
// them synced; while set-backends reaches the instances one after the
// other (or their static lists differ) it lists replicas this instance's
// pool does not. A waiter must only ever be handed one of its own
// candidates.

// pickWaits starts a Pick of req on s that must wait, and returns once
// the global queue shows it (so the order of calls is the queue's).
func pickWaits(t *testing.T, c rueidis.Client, s *Store, name string, out chan<- got, req *lb.Request) {
	t.Helper()
	before := hlen(t, c, s.k.waiters)
	go func() {
		l, err := s.Pick(context.Background(), req)
		var ll *Lease
		if l != nil {
			ll = l.(*Lease)
		}
		out <- got{name, ll, err, time.Now()}
	}()
	waitFor(t, name+" to be queued", func() bool { return hlen(t, c, s.k.waiters) == before+1 })
}

// next is the next Select or Pick to return, within 5 s.
func next(t *testing.T, out <-chan got, what string) got {
	t.Helper()
	select {
	case g := <-out:
		return g
	case <-time.After(5 * time.Second):
		t.Fatalf("no answer within 5s: %s", what)
	}
	return got{}
}

// Partial overlap: set-backends reached y (now {a, b, c}) and not yet x
// ({a, b}). x's waiter, queued first, is not handed c: it is not in x's
// pool. A request of y, behind it, may use c and gets it at once (a free
// replica goes to the first waiter that may use it, not only to the
// head); x's waiter gets a as soon as a frees.
func TestQueueWaiterIsHandedOnlyItsCandidates(t *testing.T) {
	redistest.Each(t, testQueueWaiterIsHandedOnlyItsCandidates)
}

func testQueueWaiterIsHandedOnlyItsCandidates(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x", "y")
	x, y := st[0], st[1]
	ownX := []string{"a", "b"}
	x.SetReplicas(ownX)
	y.SetReplicas(ownX)
	ha, hb := sel(t, x, "a"), sel(t, x, "b")
	out := make(chan got, 1)
	pickWaits(t, c, x, "x", out, &lb.Request{})
	y.SetReplicas([]string{"a", "b", "c"}) // set-backends reached y, not x yet
	if err := y.SyncErr(); err != nil {
		t.Fatal(err)
	}
	// The Sync dispatched c's free slot in the same script.
	if n := hlen(t, c, x.k.waiters); n != 1 {
		g := next(t, out, "x's waiter, gone from the queue")
		if g.err != nil {
			t.Fatalf("x's queued request: %v", g.err)
		}
		t.Fatalf("x's queued request was handed %s, which x's pool %v does not list", g.l.Addr, ownX)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ly, err := y.Pick(ctx, &lb.Request{})
	if err != nil || ly.Replica() != "c" {
		t.Fatalf("y's request behind x's waiter: %v %v, want the free c (x's waiter may not use it)", ly, err)
	}
	ha.Release(ok)
	g := next(t, out, "x's waiter to get a")
	if g.err != nil || g.l.Addr != "a" {
		t.Fatalf("after a's release: x's waiter got %v %+v, want a", g.err, g.l)
	}
	for _, l := range []lb.Lease{ly, g.l, hb} {
		l.Release(ok)
	}
	waitFor(t, "every record and waiter to go", func() bool {
		return drained(t, x, c) && queueEmpty(t, x, c) && hlen(t, c, x.k.cands) == 0
	})
}

// No overlap left: set-backends reached y ({c, d}) while x's request
// waited for a replica of x's {a, b}. It is handed neither c nor d; it
// picks again, as a pick none of whose candidates is a member does (from
// x's own counts, see setmismatch.go), instead of waiting its whole
// queue_timeout.
func TestQueueWaiterWhoseCandidatesAllLeftPicksAgain(t *testing.T) {
	redistest.Each(t, testQueueWaiterWhoseCandidatesAllLeftPicksAgain)
}

func testQueueWaiterWhoseCandidatesAllLeftPicksAgain(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x", "y")
	x, y := st[0], st[1]
	ownX := []string{"a", "b"}
	x.SetReplicas(ownX)
	y.SetReplicas(ownX)
	ha, hb := sel(t, y, "a"), sel(t, y, "b")
	out := make(chan got, 1)
	req := &lb.Request{}
	pickWaits(t, c, x, "x", out, req)
	y.SetReplicas([]string{"c", "d"})
	g := next(t, out, "x's waiter to be answered")
	if g.err != nil {
		t.Fatalf("x's waiter: %v", g.err)
	}
	if !slices.Contains(ownX, g.l.Addr) {
		t.Fatalf("x's queued request was handed %s, which x's pool %v does not list", g.l.Addr, ownX)
	}
	if !g.l.Fallback || req.Reason != lb.ReasonLocalFallback {
		t.Fatalf("x's request: %+v (reason %q), want a pick from x's own counts", g.l, req.Reason)
	}
	g.l.Release(ok)
	ha.Release(ok)
	hb.Release(ok)
	waitFor(t, "every record and waiter to go", func() bool {
		return drained(t, x, c) && queueEmpty(t, x, c) && hlen(t, c, x.k.cands) == 0
	})
}

// Storm over partly overlapping sets: three instances whose pools are
// {a, b}, {b, c} and {a, b, c, d} pick and release concurrently. Every
// lease is on a replica of its own instance's pool, no replica holds two
// requests at once, and at the end every count is 0 and the queue is
// empty.
//
//   - flipping: the instances keep syncing their sets (the member set in
//     Redis flips between them), and requests give up after 15-65 ms.
//   - steady: the member set is the last instance's, nobody gives up:
//     every request is served (none waits for a slot it may use while
//     that slot stays free, nor is passed over for good).
func TestQueueStormOverPartlyOverlappingSets(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		t.Run("flipping", func(t *testing.T) { testQueueStormOverPartlyOverlappingSets(t, tg, true) })
		t.Run("steady", func(t *testing.T) { testQueueStormOverPartlyOverlappingSets(t, tg, false) })
	})
}

func testQueueStormOverPartlyOverlappingSets(t *testing.T, tg redistest.Target, flipping bool) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	cfg.QueueTimeout = 40 * time.Millisecond
	if !flipping {
		cfg.QueueTimeout = 20 * time.Second
	}
	st := queueStores(t, cfg, "i0", "i1", "i2")
	pools := [][]string{{"a", "b"}, {"b", "c"}, {"a", "b", "c", "d"}}
	for i, s := range st {
		s.SetReplicas(pools[i])
	}
	var holders sync.Map // replica → *atomic.Int32 (Redis leases only)
	for _, r := range pools[2] {
		holders.Store(r, new(atomic.Int32))
	}
	var leased, handed, refused, strays atomic.Int64
	stop := make(chan struct{})
	var syncs sync.WaitGroup
	syncs.Go(func() { // dispatch's {tag}:idle never names a member a waiter lists
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if bad := idleWanted(t, c, st[0]); bad != "" {
				t.Errorf("{tag}:idle names a member a queued waiter lists: %s", bad)
				return
			}
		}
	})
	syncs.Go(func() { // the member set flips between the instances' sets
		for i := 0; flipping; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(5+rand.IntN(20)) * time.Millisecond):
			}
			st[i%3].SetReplicas(pools[i%3])
		}
	})
	var wg sync.WaitGroup
	for i, s := range st {
		for range 10 {
			wg.Go(func() {
				for range 40 {
					wait := time.Duration(15+rand.IntN(50)) * time.Millisecond
					if !flipping {
						wait = 20 * time.Second
					}
					ctx, cancel := context.WithTimeout(context.Background(), wait)
					req := &lb.Request{}
					l, err := s.Pick(ctx, req)
					cancel()
					switch {
					case flipping && (errors.Is(err, lb.ErrQueueTimeout) || errors.Is(err, lb.ErrSaturated) ||
						errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
						refused.Add(1)
						continue
					case err != nil:
						t.Errorf("%s: pick: %v", s.InstanceID(), err)
						return
					}
					if !slices.Contains(pools[i], l.Replica()) && strays.Add(1) <= 5 {
						t.Errorf("%s: a request (%s) was handed %s, which its pool %v does not list",
							s.InstanceID(), req.Reason, l.Replica(), pools[i])
					}
					lease := l.(*Lease)
					var h *atomic.Int32
					if lease.Fallback && !flipping {
						t.Errorf("%s: a pick from local counts with every instance's pool sharing members", s.InstanceID())
					}
					if !lease.Fallback {
						v, _ := holders.Load(l.Replica())
						h = v.(*atomic.Int32)
						if n := h.Add(1); n != 1 {
							t.Errorf("%s leased to %d requests at once", l.Replica(), n)
						}
					}
					if req.Reason == lb.ReasonQueued {
						handed.Add(1)
					}
					leased.Add(1)
					time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
					if h != nil {
						h.Add(-1)
					}
					if !l.Release(ok) {
						t.Errorf("first release of a lease on %s returned false", l.Replica())
					}
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	syncs.Wait()
	t.Logf("%d leased (%d handed over by the queue), %d refused or given up", leased.Load(), handed.Load(), refused.Load())
	if n := strays.Load(); n > 0 {
		t.Fatalf("%d of %d leases on a replica outside their instance's pool", n, leased.Load())
	}
	if handed.Load() == 0 {
		t.Fatal("the storm never handed a queued request a slot")
	}
	for _, s := range st {
		if ss := s.Stats(); ss.Selections != ss.Releases || ss.Waiting != 0 || ss.Pending != 0 {
			t.Fatalf("%s: stats %+v", s.InstanceID(), ss)
		}
	}
	waitFor(t, "every count at 0 and the queue empty", func() bool {
		return drained(t, st[0], c) && queueEmpty(t, st[0], c) && hlen(t, c, st[0].k.cands) == 0
	})
}

// A waiter none of whose candidates is left in the pool is refused at
// once even when it is not at the head and no slot is free: the Sync
// that took them out scans the whole queue. It used to wait behind the
// head (which still waits for a member) until its queue_timeout.
func TestQueueWaiterBehindTheHeadIsRefusedWhenItsCandidatesLeave(t *testing.T) {
	redistest.Each(t, testQueueWaiterBehindTheHeadIsRefusedWhenItsCandidatesLeave)
}

func testQueueWaiterBehindTheHeadIsRefusedWhenItsCandidatesLeave(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x", "y")
	x, y := st[0], st[1]
	ctx := context.Background()
	for _, s := range st {
		if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
	}
	ha, hb := sel(t, x, "a"), sel(t, x, "b")
	out := make(chan got, 2)
	enqueue(t, ctx, c, x, "x", out, "a") // the head, waits for a
	enqueue(t, ctx, c, y, "y", out, "b") // may only have b
	// b leaves the pool
	if err := y.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	g := next(t, out, "y's waiter to be refused")
	if g.name != "y" || !errors.Is(g.err, lb.ErrAllDown) {
		t.Fatalf("%s: %+v %v, want y refused (lb.ErrAllDown) at once", g.name, g.l, g.err)
	}
	if n := hlen(t, c, x.k.waiters); n != 1 {
		t.Fatalf("%d waiters, want x's still waiting", n)
	}
	ha.Release(ok)
	g = next(t, out, "x's waiter to get a")
	if g.name != "x" || g.err != nil || g.l.Addr != "a" {
		t.Fatalf("%s: %+v %v, want x on a", g.name, g.l, g.err)
	}
	g.l.Release(ok)
	hb.Release(ok)
	waitFor(t, "every record and waiter to go", func() bool {
		return drained(t, x, c) && queueEmpty(t, x, c) && hlen(t, c, x.k.cands) == 0
	})
}

// A waiter whose candidates entry is missing (lost, or queued by an
// older version that kept none) is refused when a slot frees, not handed
// it: what it may be given is unknown. Its instance picks again.
func TestQueueWaiterWithoutCandidatesIsRefused(t *testing.T) {
	redistest.Each(t, testQueueWaiterWithoutCandidatesIsRefused)
}

func testQueueWaiterWithoutCandidatesIsRefused(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	x := queueStores(t, queueConfFor(t, tg), "x")[0]
	ctx := context.Background()
	if err := x.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "a")
	out := make(chan got, 1)
	enqueue(t, ctx, c, x, "x", out, "a")
	if err := c.Do(ctx, c.B().Del().Key(x.k.cands).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	held.Release(ok)
	g := next(t, out, "the waiter without candidates to be answered")
	if !errors.Is(g.err, lb.ErrAllDown) {
		t.Fatalf("the waiter without candidates: %+v %v, want refused (lb.ErrAllDown)", g.l, g.err)
	}
	wantCounts(t, x, map[string]int64{"a": 0})
	waitFor(t, "every record and waiter to go", func() bool { return drained(t, x, c) && queueEmpty(t, x, c) })
}

// idleWantedScript checks, atomically, the invariant dispatch keeps in
// {tag}:idle: no queued waiter lists an idle member among its candidates.
// KEYS: queue, waiters, cands, idle. Reply: "" or the first violation.
var idleWantedScript = rueidis.NewLuaScript(`
local idle = {}
local kv = redis.call('HGETALL', KEYS[4])
for i = 1, #kv, 2 do idle[kv[i]] = true end
local q = redis.call('LRANGE', KEYS[1], 0, -1)
for i = 1, #q do
  if redis.call('HEXISTS', KEYS[2], q[i]) == 1 then
    local cands = redis.call('HGET', KEYS[3], q[i]) or ''
    for m in string.gmatch(cands, '[^\n]+') do
      if idle[m] then return q[i] .. ' lists ' .. m end
    end
  end
end
return ''
`)

func idleWanted(t *testing.T, c rueidis.Client, s *Store) string {
	bad, err := idleWantedScript.Exec(context.Background(), c, []string{s.k.queue, s.k.waiters, s.k.cands, s.k.idle}, nil).ToString()
	if err != nil {
		t.Errorf("checking {tag}:idle: %v", err)
	}
	return bad
}
