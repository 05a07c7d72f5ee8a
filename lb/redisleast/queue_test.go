package redisleast

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// queueConfig is a queueing-mode config for the single server at addr:
// one slot per replica.
func queueConfig(t testing.TB, addr string) Config { return queueConfFor(t, single(addr)) }

// queueConfFor is a queueing-mode config for the target: one slot per
// replica.
func queueConfFor(t testing.TB, tg redistest.Target) Config {
	cfg := confFor(t, tg)
	cfg.MaxInflight = 1
	cfg.QueueTimeout = 20 * time.Second
	return cfg
}

func queueStores(t testing.TB, cfg Config, names ...string) []*Store {
	out := make([]*Store, len(names))
	for i, n := range names {
		c := cfg
		c.InstanceID = n
		out[i] = newStore(t, c, "p")
	}
	return out
}

func hlen(t testing.TB, c rueidis.Client, key string) int64 {
	n, err := c.Do(context.Background(), c.B().Hlen().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func llen(t testing.TB, c rueidis.Client, key string) int64 {
	n, err := c.Do(context.Background(), c.B().Llen().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// queueEmpty: no waiter, no token, no assignment left.
func queueEmpty(t testing.TB, s *Store, c rueidis.Client) bool {
	return llen(t, c, s.k.queue) == 0 && hlen(t, c, s.k.waiters) == 0 && hlen(t, c, s.k.assigned) == 0
}

type got struct {
	name string
	l    *Lease
	err  error
	at   time.Time
}

// enqueue starts a Select on s that must wait, and returns once the
// global queue shows it (so the order of enqueue calls is the queue's).
func enqueue(t *testing.T, ctx context.Context, c rueidis.Client, s *Store, name string, out chan<- got, cands ...string) {
	t.Helper()
	before := hlen(t, c, s.k.waiters)
	go func() {
		l, err := s.Select(ctx, cands)
		out <- got{name, l, err, time.Now()}
	}()
	waitFor(t, name+" to be queued", func() bool { return hlen(t, c, s.k.waiters) == before+1 })
}

func TestQueueFIFOAcrossInstances(t *testing.T) { redistest.Each(t, testQueueFIFOAcrossInstances) }

func testQueueFIFOAcrossInstances(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x", "y", "z")
	x, y, z := st[0], st[1], st[2]
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")

	out := make(chan got, 8)
	order := []string{"y1", "z1", "y2", "z2", "x1"}
	for _, n := range order {
		s := map[byte]*Store{'x': x, 'y': y, 'z': z}[n[0]]
		enqueue(t, context.Background(), c, s, n, out, "r")
	}
	if n := llen(t, c, x.k.queue); n != int64(len(order)) {
		t.Fatalf("queue length %d, want %d", n, len(order))
	}
	wantCounts(t, x, map[string]int64{"r": 1})

	var slowest time.Duration
	for _, want := range order {
		released := time.Now()
		held.Release(ok)
		g := <-out
		if g.err != nil {
			t.Fatalf("%s: %v", g.name, g.err)
		}
		if g.name != want {
			t.Fatalf("slot went to %s, want %s (the oldest waiter)", g.name, want)
		}
		if g.l.Addr != "r" || g.l.Fallback {
			t.Fatalf("%s: lease %+v", g.name, g.l)
		}
		slowest = max(slowest, g.at.Sub(released))
		wantCounts(t, x, map[string]int64{"r": 1})
		held = g.l
	}
	held.Release(ok)
	t.Logf("slowest hand-over (release → waiter's Select returns) %v", slowest)
	if slowest > time.Second {
		t.Fatalf("a hand-over took %v: the waiter was not notified", slowest)
	}
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		t.Fatalf("after the last release: counts %v, queue not empty or records left", mustCounts(t, x))
	}
	for _, s := range st {
		if s := s.Stats(); s.Selections != s.Releases || s.QueueTimeouts != 0 {
			t.Fatalf("stats %+v", s)
		}
	}
	if h := y.Stats().Handovers + z.Stats().Handovers + x.Stats().Handovers; h != uint64(len(order)) {
		t.Fatalf("%d hand-overs, want %d", h, len(order))
	}
}

// A new request does not overtake queued ones even when it arrives just
// as a slot frees (the slot goes to the queue's head).
func TestQueueNewRequestDoesNotOvertake(t *testing.T) {
	redistest.Each(t, testQueueNewRequestDoesNotOvertake)
}

func testQueueNewRequestDoesNotOvertake(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x", "y")
	x, y := st[0], st[1]
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")
	out := make(chan got, 2)
	enqueue(t, context.Background(), c, y, "first", out, "r")
	enqueue(t, context.Background(), c, x, "second", out, "r")
	held.Release(ok)
	g := <-out
	if g.name != "first" || g.err != nil {
		t.Fatalf("got %s (%v), want first", g.name, g.err)
	}
	g.l.Release(ok)
	g = <-out
	if g.name != "second" || g.err != nil {
		t.Fatalf("got %s (%v), want second", g.name, g.err)
	}
	g.l.Release(ok)
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		t.Fatal("records left")
	}
}

func TestQueueCancelAndTimeout(t *testing.T) { redistest.Each(t, testQueueCancelAndTimeout) }

func testQueueCancelAndTimeout(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	st := queueStores(t, cfg, "x", "y")
	x, y := st[0], st[1]
	short := cfg
	short.InstanceID, short.QueueTimeout = "z", 300*time.Millisecond
	z := newStore(t, short, "p")
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")

	// The cancelled waiter leaves the queue at once.
	out := make(chan got, 4)
	ctx, cancel := context.WithCancel(context.Background())
	enqueue(t, ctx, c, y, "cancelled", out, "r")
	cancel()
	g := <-out
	if !errors.Is(g.err, context.Canceled) {
		t.Fatalf("cancelled waiter: err %v, want context.Canceled", g.err)
	}
	if !queueEmpty(t, x, c) {
		t.Fatal("the cancelled waiter is still queued")
	}

	// The timed-out waiter gets ErrQueueTimeout after QueueTimeout.
	start := time.Now()
	enqueue(t, context.Background(), c, z, "timeout", out, "r")
	g = <-out
	if !errors.Is(g.err, ErrQueueTimeout) {
		t.Fatalf("timed-out waiter: err %v, want ErrQueueTimeout", g.err)
	}
	if waited := g.at.Sub(start); waited < short.QueueTimeout || waited > short.QueueTimeout+2*time.Second {
		t.Fatalf("timed out after %v, QueueTimeout %v", waited, short.QueueTimeout)
	}
	if !queueEmpty(t, x, c) {
		t.Fatal("the timed-out waiter is still queued")
	}

	// Nobody waits any more: the released slot stays free.
	held.Release(ok)
	wantCounts(t, x, map[string]int64{"r": 0})
	if !drained(t, x, c) {
		t.Fatal("records left")
	}
	if s := y.Stats(); s.QueueCancels != 1 || s.Selections != 0 {
		t.Fatalf("y stats %+v", s)
	}
	if s := z.Stats(); s.QueueTimeouts != 1 || s.Selections != 0 {
		t.Fatalf("z stats %+v", s)
	}
}

// A waiter handed a slot whose notification is lost finds it when it gives
// up: on timeout it keeps the slot (dispatched just in time), on
// cancellation the slot goes straight to the next waiter.
func TestQueueGiveUpRacesHandOver(t *testing.T) { redistest.Each(t, testQueueGiveUpRacesHandOver) }

func testQueueGiveUpRacesHandOver(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	x := queueStores(t, cfg, "x")[0]
	short := cfg
	short.InstanceID, short.QueueTimeout = "y", 500*time.Millisecond
	y := newStore(t, short, "p")
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	// loseNotification unregisters y's only waiter: the hand-over's
	// message then goes nowhere.
	loseNotification := func() {
		queueOf(y).waiters.mu.Lock()
		defer queueOf(y).waiters.mu.Unlock()
		if len(queueOf(y).waiters.m) != 1 {
			t.Fatalf("y waiters %v", queueOf(y).waiters.m)
		}
		clear(queueOf(y).waiters.m)
	}
	out := make(chan got, 2)

	// Timeout: the lost hand-over is found at the deadline and kept.
	held := sel(t, x, "r")
	start := time.Now()
	enqueue(t, context.Background(), c, y, "late", out, "r")
	loseNotification()
	held.Release(ok)
	g := <-out
	if g.err != nil || g.name != "late" || g.l.Addr != "r" {
		t.Fatalf("late: %v %+v", g.err, g.l)
	}
	if waited := g.at.Sub(start); waited < short.QueueTimeout {
		t.Fatalf("returned after %v, before its deadline: was it told?", waited)
	}
	wantCounts(t, x, map[string]int64{"r": 1})

	// Cancellation: the lost hand-over is released to the next waiter.
	ctx, cancel := context.WithCancel(context.Background())
	enqueue(t, ctx, c, y, "cancelled", out, "r")
	loseNotification()
	enqueue(t, context.Background(), c, x, "next", out, "r")
	g.l.Release(ok)
	waitFor(t, "the hand-over to y", func() bool { return hlen(t, c, x.k.assigned) == 1 })
	cancel()
	for range 2 {
		g = <-out
		switch g.name {
		case "cancelled":
			if !errors.Is(g.err, context.Canceled) {
				t.Fatalf("cancelled: %v", g.err)
			}
		case "next":
			if g.err != nil {
				t.Fatalf("next: %v", g.err)
			}
			g.l.Release(ok)
		}
	}
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		t.Fatalf("records left: counts %v", mustCounts(t, x))
	}
	if s := y.Stats(); s.Selections != s.Releases || s.QueueCancels != 1 || s.QueueTimeouts != 0 {
		t.Fatalf("y stats %+v", s)
	}
}

func TestQueueLostNotificationIsRechecked(t *testing.T) {
	redistest.Each(t, testQueueLostNotificationIsRechecked)
}

func testQueueLostNotificationIsRechecked(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x", "y")
	x, y := st[0], st[1]
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")
	out := make(chan got, 1)
	enqueue(t, context.Background(), c, y, "y", out, "r")
	// Break every subscription, then hand the slot over while y is (most
	// likely) not subscribed: the recheck at resubscription finds it. (On
	// a cluster, on every node: the subscriber holds one of them.)
	for _, n := range c.Nodes() {
		if err := n.Do(context.Background(), n.B().ClientKill().TypePubsub().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	released := time.Now()
	held.Release(ok)
	g := <-out
	if g.err != nil {
		t.Fatal(g.err)
	}
	t.Logf("told after %v despite the broken subscription", g.at.Sub(released))
	if g.at.Sub(released) > 5*time.Second {
		t.Fatal("the hand-over was only found at the deadline")
	}
	g.l.Release(ok)
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		t.Fatal("records left")
	}
}

// A Sync adding a replica hands its free slot to the waiters whose
// candidates list it (y's pool has b already; the pool in Redis gets it
// with x's Sync).
func TestQueueSyncAddingReplicaWakesWaiters(t *testing.T) {
	redistest.Each(t, testQueueSyncAddingReplicaWakesWaiters)
}

func testQueueSyncAddingReplicaWakesWaiters(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x", "y")
	x, y := st[0], st[1]
	if err := x.Sync(context.Background(), []string{"a"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "a")
	out := make(chan got, 2)
	enqueue(t, context.Background(), c, y, "y1", out, "a", "b")
	enqueue(t, context.Background(), c, y, "y2", out, "a", "b")
	if err := x.Sync(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	g := <-out
	if g.err != nil || g.name != "y1" || g.l.Addr != "b" {
		t.Fatalf("after Sync added b: %s %v %+v", g.name, g.err, g.l)
	}
	wantCounts(t, x, map[string]int64{"a": 1, "b": 1})
	held.Release(ok)
	g2 := <-out
	if g2.err != nil || g2.name != "y2" || g2.l.Addr != "a" {
		t.Fatalf("after release: %s %v %+v", g2.name, g2.err, g2.l)
	}
	g.l.Release(ok)
	g2.l.Release(ok)
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		t.Fatal("records left")
	}
}

// A waiter whose instance dies after being handed a slot: the slot is
// reclaimed by the reaper and goes to the next waiter.
func TestQueueDeadWaiterSlotIsReclaimed(t *testing.T) {
	redistest.Each(t, testQueueDeadWaiterSlotIsReclaimed)
}

func testQueueDeadWaiterSlotIsReclaimed(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	cfg.LeaseTTL = 500 * time.Millisecond
	st := queueStores(t, cfg, "x", "y", "z")
	x, y, z := st[0], st[1], st[2]
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")
	out := make(chan got, 2)
	enqueue(t, context.Background(), c, y, "y", out, "r")
	enqueue(t, context.Background(), c, z, "z", out, "r")
	held.Release(ok)
	g := <-out
	if g.name != "y" || g.err != nil {
		t.Fatalf("got %s %v, want y", g.name, g.err)
	}
	y.crash() // dies holding the slot the queue gave it
	died := time.Now()
	g = <-out
	if g.name != "z" || g.err != nil {
		t.Fatalf("got %s %v, want z", g.name, g.err)
	}
	took := g.at.Sub(died)
	bound := cfg.LeaseTTL + x.reapInterval()
	t.Logf("the dead waiter's slot reached the next waiter after %v (bound LeaseTTL+interval %v)", took, bound)
	if took > bound+time.Second {
		t.Fatalf("reclaimed after %v, bound %v", took, bound)
	}
	g.l.Release(ok)
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		t.Fatalf("records left: counts %v", mustCounts(t, x))
	}
}

// Storm: concurrent selects, releases and cancellations from 3 instances.
// A replica is never leased to two requests at once, and at the end every
// count is 0 and the queue's keys are empty.
func TestQueueStormExactlyOnce(t *testing.T) { redistest.Each(t, testQueueStormExactlyOnce) }

func testQueueStormExactlyOnce(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	cfg.QueueTimeout = 25 * time.Millisecond
	st := queueStores(t, cfg, "i0", "i1", "i2")
	reps := []string{"a", "b", "c"}
	if err := st[0].Sync(context.Background(), reps); err != nil {
		t.Fatal(err)
	}
	var holders sync.Map // replica → *atomic.Int32
	for _, r := range reps {
		holders.Store(r, new(atomic.Int32))
	}
	var leased, timeouts, cancels atomic.Int64
	var wg sync.WaitGroup
	for _, s := range st {
		for range 12 {
			wg.Go(func() {
				for range 40 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(15+rand.IntN(50))*time.Millisecond)
					l, err := s.Select(ctx, reps)
					cancel()
					switch {
					case errors.Is(err, ErrQueueTimeout):
						timeouts.Add(1)
						continue
					case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
						cancels.Add(1)
						continue
					case err != nil:
						t.Errorf("select: %v", err)
						return
					}
					if l.Fallback {
						t.Error("fallback during the storm")
					}
					h, _ := holders.Load(l.Addr)
					if n := h.(*atomic.Int32).Add(1); n != 1 {
						t.Errorf("%s leased to %d requests at once", l.Addr, n)
					}
					leased.Add(1)
					time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
					h.(*atomic.Int32).Add(-1)
					l.Release(ok)
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d leased, %d queue timeouts, %d client cancels", leased.Load(), timeouts.Load(), cancels.Load())
	for _, s := range st {
		if p := s.Stats().Pending; p != 0 {
			t.Fatalf("%s: %d releases pending without an outage", s.InstanceID(), p)
		}
	}
	if !drained(t, st[0], c) {
		t.Fatalf("counts after the storm: %v", mustCounts(t, st[0]))
	}
	if !queueEmpty(t, st[0], c) {
		t.Fatalf("queue %d, waiters %d, assigned %d after the storm",
			llen(t, c, st[0].k.queue), hlen(t, c, st[0].k.waiters), hlen(t, c, st[0].k.assigned))
	}
	var handed uint64
	for _, s := range st {
		ss := s.Stats()
		if ss.Selections != ss.Releases || ss.Waiting != 0 {
			t.Fatalf("%s: stats %+v", s.InstanceID(), ss)
		}
		handed += ss.Handovers
	}
	if handed == 0 || leased.Load() == 0 {
		t.Fatal("the storm never queued")
	}
}

// Plain-mode behaviour of an empty queue is unchanged, and the config is
// validated.
func TestQueueConfig(t *testing.T) {
	base := Config{Config: redisconn.Config{Addrs: []string{"127.0.0.1:6379"}}, QueueTimeout: time.Second}.WithDefaults()
	if err := base.Validate(); err == nil {
		t.Fatal("queue_timeout without max_inflight accepted")
	}
	base.MaxInflight = 2
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	base.QueueTimeout = -time.Second
	if err := base.Validate(); err == nil {
		t.Fatal("negative queue_timeout accepted")
	}
}

// BenchmarkQueueSelectRelease: select + release in queueing mode under
// contention: 4 instances, 4 replicas with one slot each, so most selects
// wait in the global queue and are handed a slot by a release.
func BenchmarkQueueSelectRelease(b *testing.B) {
	addr := testRedis(b)
	reps := []string{"r0", "r1", "r2", "r3"}
	for _, conc := range []int{8, 64} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			cfg := queueConfig(b, addr)
			cfg.QueueTimeout = time.Minute
			st := queueStores(b, cfg, "b0", "b1", "b2", "b3")
			if err := st[0].Sync(context.Background(), reps); err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var lat []time.Duration
			var n atomic.Int64
			b.ResetTimer()
			start := time.Now()
			b.SetParallelism(max(1, conc/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				s := st[n.Add(1)%int64(len(st))]
				var mine []time.Duration
				for pb.Next() {
					t0 := time.Now()
					l, err := s.Select(context.Background(), reps)
					if err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(t0))
					l.Release(lb.Outcome{Kind: lb.Success})
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			elapsed := time.Since(start)
			b.StopTimer()
			var handed uint64
			for _, s := range st {
				handed += s.Stats().Handovers
			}
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "select-p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "select-p99-µs")
				b.ReportMetric(float64(handed)/float64(b.N), "handed/op")
			}
		})
	}
}

// Redis frozen: nothing is queued globally (local fallback, shedding at
// MaxInflight); a waiter queued before the outage gets the slot released
// during it once the pending release reaches Redis.
func TestQueueDuringOutage(t *testing.T) {
	srv := privateRedis(t)
	c := raw(t, srv.Addr)
	cfg := queueConfig(t, srv.Addr)
	cfg.ReadTimeout = 300 * time.Millisecond
	cfg.BreakerBackoff = 50 * time.Millisecond
	st := queueStores(t, cfg, "x", "y")
	x, y := st[0], st[1]
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")
	out := make(chan got, 1)
	enqueue(t, context.Background(), c, y, "y", out, "r")
	// y waits for the queue's answer only once it has the script's reply
	// (its waiter in Redis is not enough: frozen between the two, Redis
	// never sent the reply, and y's Select fell back to local counts, as
	// a select without an answer does).
	waitFor(t, "y to await its turn", func() bool { return y.Stats().QueuedTotal == 1 })

	srv.Signal(syscall.SIGSTOP)
	if _, err := x.Select(context.Background(), []string{"r"}); !errors.Is(err, ErrSaturated) {
		t.Fatalf("select with Redis frozen: %v, want the local fallback to shed", err) // x holds r locally
	}
	if x.Stats().Breaker != Open {
		t.Fatal("breaker closed with Redis frozen")
	}
	held.Release(ok) // pending
	srv.Signal(syscall.SIGCONT)
	g := <-out
	if g.err != nil || g.l.Addr != "r" || g.l.Fallback {
		t.Fatalf("waiter after the outage: %v %+v", g.err, g.l)
	}
	g.l.Release(ok)
	waitFor(t, "the breaker to close", func() bool { return x.Stats().Breaker == Closed })
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		t.Fatalf("records left: counts %v", mustCounts(t, x))
	}
}

func TestQueueMetrics(t *testing.T) { redistest.Each(t, testQueueMetrics) }

func testQueueMetrics(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	st := queueStores(t, queueConfFor(t, tg), "x")
	x := st[0]
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")
	out := make(chan got, 1)
	enqueue(t, context.Background(), c, x, "w", out, "r")
	queueOf(x).maintain(context.Background()) // the loop's kick
	if s := x.Stats(); s.Queued != 1 || s.Waiting != 1 {
		t.Fatalf("queued %d waiting %d, want 1 and 1", s.Queued, s.Waiting)
	}
	held.Release(ok)
	g := <-out
	g.l.Release(ok)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func() map[string]*Store { return map[string]*Store{"p": x} }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				seen[mf.GetName()] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				seen[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				seen[mf.GetName()] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for name, want := range map[string]float64{"sluice_redis_queue_handovers_total": 1, "sluice_redis_queue_wait_seconds": 1,
		"sluice_redis_queue_timeouts_total": 0, "sluice_redis_queue_waiting": 0} {
		if got, ok := seen[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
}

// queueOf is the global queue of a queueing store.
func queueOf(s *Store) *globalQueue { return s.mode.(*globalQueue) }

// A waiter is never handed a member its avoid entry names (down at its
// instance, or not among its candidates). When no member it may be given
// is left at all (here its only candidate left the pool), it could only
// wait at the head of the queue until its own queue_timeout, and every
// waiter behind it, of every instance, with it. It is refused at once
// (errors.Is lb.ErrAllDown, so a retry tries again without its avoid
// list) and the next waiter gets the slot.
func TestQueueHeadNoMemberCanServeIsRefused(t *testing.T) {
	redistest.Each(t, testQueueHeadNoMemberCanServeIsRefused)
}

func testQueueHeadNoMemberCanServeIsRefused(t *testing.T, tg redistest.Target) {
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
	enqueue(t, ctx, c, y, "y", out, "b") // may only have b
	enqueue(t, ctx, c, x, "x", out, "a", "b")
	if err := x.Sync(ctx, []string{"a"}); err != nil { // b leaves the pool
		t.Fatal(err)
	}
	ha.Release(ok)
	res := map[string]got{}
	for range 2 {
		g := <-out
		res[g.name] = g
	}
	if g := res["y"]; !errors.Is(g.err, lb.ErrAllDown) {
		t.Fatalf("the waiter no member can serve got %v, want a refusal (lb.ErrAllDown) at once", g.err)
	}
	if g := res["x"]; g.err != nil || g.l.Addr != "a" {
		t.Fatalf("the waiter behind it got %v %v, want a", g.l, g.err)
	}
	res["x"].l.Release(ok)
	hb.Release(ok)
	waitFor(t, "every record and waiter to go", func() bool { return drained(t, x, c) && queueEmpty(t, x, c) })
}
