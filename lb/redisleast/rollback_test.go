package redisleast

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// snapshot is a copy of every key of a pool at one moment, as a Redis
// restarted from an older RDB file, or a lagging replica promoted, holds
// it: each key's DUMP and the time it had left to live. Taken and put
// back by a script each (all of a pool's keys share a slot), so that
// neither sees a pick or release half done.
type snapshot struct {
	c    rueidis.Client
	tag  string
	keys []string // key, dump, ttl ms (0: none), ...
}

var snapshotScript = rueidis.NewLuaScript(`
local out = {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  out[#out + 1] = k
  out[#out + 1] = redis.call('DUMP', k)
  out[#out + 1] = tostring(math.max(redis.call('PTTL', k), 0))
end
return out
`)

var rollBackScript = rueidis.NewLuaScript(`
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end
for i = 2, #ARGV, 3 do redis.call('RESTORE', ARGV[i], ARGV[i + 2], ARGV[i + 1], 'REPLACE') end
return 1
`)

func takeSnapshot(t *testing.T, c rueidis.Client, tag string) snapshot {
	t.Helper()
	// KEYS[1] routes the script to the pool's slot.
	keys, err := snapshotScript.Exec(context.Background(), c, []string{tag + ":load"}, []string{tag + "*"}).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return snapshot{c: c, tag: tag, keys: keys}
}

// rollBack makes the pool's keys what they were at the snapshot: every
// key written since is gone, every key of then is back as it was.
func (sn snapshot) rollBack(t *testing.T) {
	t.Helper()
	args := append([]string{sn.tag + "*"}, sn.keys...)
	if err := rollBackScript.Exec(context.Background(), sn.c, []string{sn.tag + ":load"}, args).Error(); err != nil {
		t.Fatal(err)
	}
}

// recordsOf is an instance hash's request records (request id → replica),
// without tombstones and bookkeeping fields.
func recordsOf(t *testing.T, c rueidis.Client, inst string) map[string]string {
	t.Helper()
	kv, err := c.Do(context.Background(), c.B().Hgetall().Key(inst).Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for f, v := range kv {
		if f != "#" && f != "!" && v != "" {
			out[f] = v
		}
	}
	return out
}

// Redis that comes back with older data (restarted from an RDB snapshot,
// a lagging replica promoted) has lost acknowledged writes: releases —
// their records count again, for good (nothing reaps a live instance),
// so with max_inflight the pool shed or queued until Sluice restarted —
// and picks, whose requests then count nowhere. The instance notices its
// records went back (their version is older than one Redis already
// acknowledged) and rewrites them from the leases it holds.
func TestRedisRollbackIsReconciled(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		for _, m := range []struct {
			name string
			cfg  func() Config
		}{
			{"batched", func() Config { return confFor(t, tg) }},
			{"shedding", func() Config { c := confFor(t, tg); c.MaxInflight = 1; return c }},
			{"queueing", func() Config { return queueConfFor(t, tg) }},
		} {
			t.Run(m.name, func(t *testing.T) { testRedisRollbackIsReconciled(t, tg, m.cfg()) })
		}
	})
}

func testRedisRollbackIsReconciled(t *testing.T, tg redistest.Target, cfg Config) {
	cfg.LeaseTTL = 300 * time.Millisecond // a maintenance round every 100 ms
	s := newStore(t, cfg, "p")
	c := rawFor(t, tg)
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	countsAre := func(want map[string]int64) func() bool {
		return func() bool { return maps.Equal(mustCounts(t, s), want) }
	}
	la, lb := sel(t, s, "a"), sel(t, s, "b")
	waitFor(t, "both picks in Redis", countsAre(map[string]int64{"a": 1, "b": 1}))
	sn := takeSnapshot(t, c, s.k.tag)
	la.Release(ok)
	lb.Release(ok)
	waitFor(t, "both releases in Redis", countsAre(map[string]int64{"a": 0, "b": 0}))
	lx := sel(t, s, "a") // a pick the rollback loses
	waitFor(t, "the pick in Redis", countsAre(map[string]int64{"a": 1, "b": 0}))

	sn.rollBack(t) // the releases are undone, the pick is gone

	inst := s.ident.Load().inst
	waitFor(t, "the records to be the leases the instance holds", func() bool {
		return maps.Equal(recordsOf(t, c, inst), map[string]string{lx.req: "a"}) &&
			maps.Equal(mustCounts(t, s), map[string]int64{"a": 1, "b": 0})
	})
	lb2 := sel(t, s, "b") // b's slot is free again (with max_inflight 1 it was not)
	lx.Release(ok)
	lb2.Release(ok)
	waitFor(t, "every release in Redis", func() bool { return drained(t, s, c) })
}

// In the queueing mode a rollback also brings back waiters that left the
// queue: the queue hands them slots that nobody releases (their instance
// no longer waits for them), and with one slot per replica the pool
// stalls. The instance drops its waiters it no longer waits for and
// reclaims the slots they were given.
func TestRedisRollbackDropsRestoredWaiters(t *testing.T) {
	redistest.Each(t, testRedisRollbackDropsRestoredWaiters)
}

func testRedisRollbackDropsRestoredWaiters(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	cfg.LeaseTTL = 300 * time.Millisecond
	st := queueStores(t, cfg, "x", "y")
	x, y := st[0], st[1]
	if err := x.Sync(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	held := sel(t, x, "r")
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan got, 1)
	enqueue(t, ctx, c, y, "y", out, "r")
	sn := takeSnapshot(t, c, x.k.tag)
	cancel()
	if g := <-out; !errors.Is(g.err, context.Canceled) {
		t.Fatalf("the cancelled waiter got %v", g.err)
	}
	waitFor(t, "the waiter to leave the queue", func() bool { return queueEmpty(t, x, c) })

	sn.rollBack(t)   // y's waiter is back in the queue
	held.Release(ok) // its slot goes to the head of the queue

	wctx, wcancel := context.WithTimeout(context.Background(), cfg.QueueTimeout)
	defer wcancel()
	l, err := x.Select(wctx, []string{"r"})
	if err != nil {
		t.Fatalf("a new request after the rollback: %v (the slot went to a waiter nobody waits for)", err)
	}
	l.Release(ok)
	waitFor(t, "every record and waiter to go", func() bool { return drained(t, x, c) && queueEmpty(t, x, c) })
}

// A token of an instance that the instance no longer waits for can still
// be in the queue: a rollback put it back after the instance reconciled,
// or reconcile kept it because the waiter was still there, though it had
// already left with a hand-over Redis then lost. The queue hands it a
// slot — recorded under the instance and in the assignments — and
// nobody would ever release that slot: no waiter looks for it, and no
// version regression starts a reconcile. (Seen once in
// TestRedisRollbackDuringAStorm: an assignment and its count left 30 s
// after every request had ended.) The instance releases the records it
// does not know at its next maintenance round, and only those.
func TestOrphanedAssignmentIsReleased(t *testing.T) {
	redistest.Each(t, testOrphanedAssignmentIsReleased)
}

func testOrphanedAssignmentIsReleased(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	cfg.LeaseTTL = 300 * time.Millisecond // a maintenance round every 100 ms
	st := queueStores(t, cfg, "x", "y")
	x, y := st[0], st[1]
	ctx := context.Background()
	for _, s := range st {
		if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
	}
	held := sel(t, x, "b") // a lease of x's own: its record must stay
	xid := x.ident.Load()
	ghost := token(xid, "ghost") // a waiter x does not know
	for _, cmd := range []rueidis.Completed{
		c.B().Rpush().Key(x.k.queue).Element(ghost).Build(),
		c.B().Hset().Key(x.k.waiters).FieldValue().FieldValue(ghost, xid.id).Build(),
		c.B().Hset().Key(x.k.cands).FieldValue().FieldValue(ghost, "a"+candSep+"b").Build(),
	} {
		if err := c.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	// Another instance's dispatch hands it the free slot.
	n, err := kickQueueScript.Exec(ctx, c, []string{y.k.queue, y.k.waiters, y.k.load},
		[]string{strconv.Itoa(cfg.MaxInflight), y.k.tag}).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	if n[0] != 1 {
		if recordsOf(t, c, xid.inst)["ghost"] != "a" { // x's own kick may have run first
			t.Fatalf("dispatch handed %d slots, and x has no record of the ghost: %v", n[0], recordsOf(t, c, xid.inst))
		}
	}
	waitFor(t, "x to release the slot handed to a waiter it does not know", func() bool {
		_, has := recordsOf(t, c, xid.inst)["ghost"]
		return !has && hlen(t, c, x.k.assigned) == 0 && maps.Equal(mustCounts(t, x), map[string]int64{"a": 0, "b": 1})
	})
	if got := recordsOf(t, c, xid.inst); !maps.Equal(got, map[string]string{held.req: "b"}) {
		t.Fatalf("x's records %v, want only its lease's (%s on b)", got, held.req)
	}
	held.Release(ok)
	waitFor(t, "every record and waiter to go", func() bool { return drained(t, x, c) && queueEmpty(t, x, c) })
}

// The likely way such a token came back in the storm: a waiter handed a
// slot, the hand-over lost by a rollback that put the token back in the
// queue, and a reconcile that ran while the waiter was still there (it
// keeps the instance's waiters' tokens). The request runs on the slot it
// was told of and ends: its release takes the token out of the queue
// too, so the queue never hands it a second slot.
func TestReleaseTakesTheRequestsTokenOutOfTheQueue(t *testing.T) {
	redistest.Each(t, testReleaseTakesTheRequestsTokenOutOfTheQueue)
}

func testReleaseTakesTheRequestsTokenOutOfTheQueue(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg) // max_inflight 1
	cfg.LeaseTTL = time.Minute // no maintenance round during the test
	x := queueStores(t, cfg, "x")[0]
	ctx := context.Background()
	if err := x.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	l := sel(t, x, "a")
	xid := x.ident.Load()
	tok := token(xid, l.req) // back in the queue, as the rollback left it
	for _, cmd := range []rueidis.Completed{
		c.B().Rpush().Key(x.k.queue).Element(tok).Build(),
		c.B().Hset().Key(x.k.waiters).FieldValue().FieldValue(tok, xid.id).Build(),
	} {
		if err := c.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	l.Release(ok)
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		dumpPool(t, c, x.k.tag)
		t.Fatal("the release of a request whose token was queued left a record, a count or a queue entry")
	}
}

// The symptom end to end: a Redis restarted from its last RDB snapshot,
// with max_inflight. The release acknowledged after the snapshot is
// undone, and the replica's one slot stayed taken: every pick shed (503)
// until Sluice restarted.
func TestRedisRestartedFromAnOlderSnapshotStopsShedding(t *testing.T) {
	dir := t.TempDir()
	srv, err := redistest.Start("", "--dir", dir, "--dbfilename", "dump.rdb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	cfg := testConfig(t, srv.Addr)
	cfg.MaxInflight = 1
	cfg.LeaseTTL = 300 * time.Millisecond
	cfg.ReadTimeout = 200 * time.Millisecond
	cfg.BreakerBackoff = 50 * time.Millisecond
	s := newStore(t, cfg, "rdb")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	l := sel(t, s, "a")
	c := raw(t, srv.Addr)
	if err := c.Do(ctx, c.B().Save().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	l.Release(ok) // acknowledged, and lost with the restart
	srv.Kill()
	restarted, err := redistest.Start(srv.Addr, "--dir", dir, "--dbfilename", "dump.rdb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Kill)
	var last error
	waitFor(t, "a pick through Redis after the restart", func() bool {
		l, err := s.Select(ctx, []string{"a"})
		if err != nil {
			last = err
			return false
		}
		l.Release(ok)
		last = errors.New("a local pick (breaker open)")
		return !l.Fallback
	})
	t.Logf("last refusal before the pick went through: %v", last)
}

// A waiter queued after the snapshot is not in the queue Redis came back
// with: nothing would hand it the slot that frees, and it waited its
// whole queue_timeout. Its instance queues it again (at the tail).
func TestRedisRollbackRequeuesLostWaiters(t *testing.T) {
	redistest.Each(t, testRedisRollbackRequeuesLostWaiters)
}

func testRedisRollbackRequeuesLostWaiters(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := queueConfFor(t, tg)
	cfg.LeaseTTL = 300 * time.Millisecond
	st := queueStores(t, cfg, "x", "y")
	x, y := st[0], st[1]
	for _, s := range st {
		if err := s.Sync(context.Background(), []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
	}
	ha, hb := sel(t, x, "a"), sel(t, x, "b")
	sn := takeSnapshot(t, c, x.k.tag)
	out := make(chan got, 1)
	enqueue(t, context.Background(), c, y, "y", out, "b") // it avoids a
	sn.rollBack(t)                                        // and is gone from the queue
	ha.Release(ok)                                        // not for it
	hb.Release(ok)
	g := <-out
	if g.err != nil {
		t.Fatalf("the waiter Redis lost: %v", g.err)
	}
	if g.l.Addr != "b" {
		t.Fatalf("the waiter Redis lost got %s, which it avoids", g.l.Addr)
	}
	g.l.Release(ok)
	waitFor(t, "every record and waiter to go", func() bool { return drained(t, x, c) && queueEmpty(t, x, c) })
}

// Rollbacks in the middle of a storm of picks, releases and (queueing
// mode) waits and cancellations from three instances: whatever the
// rollbacks undid, once every request has ended the pool's counts are 0,
// no record is left and the queue is empty — the reconciliations ran
// beside picks and releases without losing or doubling one.
func TestRedisRollbackDuringAStorm(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		t.Run("batched", func(t *testing.T) { testRedisRollbackDuringAStorm(t, tg, confFor(t, tg)) })
		t.Run("queueing", func(t *testing.T) {
			cfg := queueConfFor(t, tg)
			cfg.QueueTimeout = 25 * time.Millisecond
			testRedisRollbackDuringAStorm(t, tg, cfg)
		})
	})
}

func testRedisRollbackDuringAStorm(t *testing.T, tg redistest.Target, cfg Config) {
	c := rawFor(t, tg)
	cfg.LeaseTTL = 300 * time.Millisecond
	cfg.CallRate = 50 // batched: a good share of view picks
	st := queueStores(t, cfg, "i0", "i1", "i2")
	reps := []string{"a", "b", "c"}
	for _, s := range st {
		if err := s.Sync(context.Background(), reps); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var leased atomic.Int64
	var wg sync.WaitGroup
	for _, s := range st {
		for range 8 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(5+rand.IntN(40))*time.Millisecond)
					l, err := s.Select(ctx, reps)
					cancel()
					if err != nil {
						continue // queue timeouts and cancellations
					}
					leased.Add(1)
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
					l.Release(ok)
				}
			})
		}
	}
	for range 3 {
		time.Sleep(100 * time.Millisecond)
		sn := takeSnapshot(t, c, st[0].k.tag)
		time.Sleep(100 * time.Millisecond)
		sn.rollBack(t)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("%d leased", leased.Load())
	deadline := time.Now().Add(30 * time.Second)
	for !drained(t, st[0], c) || !queueEmpty(t, st[0], c) {
		if time.Now().After(deadline) {
			dumpPool(t, c, st[0].k.tag)
			t.Fatal("gave up waiting for every count at 0, no record, an empty queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dumpPool logs every key of a pool, for a failure's diagnosis.
func dumpPool(t *testing.T, c rueidis.Client, tag string) {
	ctx := context.Background()
	keys, _ := redistest.Keys(ctx, c, tag+"*")
	for _, k := range keys {
		typ, _ := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
		var v any
		switch typ {
		case "hash":
			v, _ = c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
		case "zset":
			v, _ = c.Do(ctx, c.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
		case "list":
			v, _ = c.Do(ctx, c.B().Lrange().Key(k).Start(0).Stop(-1).Build()).AsStrSlice()
		case "set":
			v, _ = c.Do(ctx, c.B().Smembers().Key(k).Build()).AsStrSlice()
		default:
			v, _ = c.Do(ctx, c.B().Get().Key(k).Build()).ToString()
		}
		t.Logf("%s %s: %v", typ, k[len(tag):], v)
	}
}

// An instance that stalled past its lease (a long pause, a stopped
// process) is taken for dead and reaped while its requests still run:
// they counted nowhere until they ended (with max_inflight, more than the
// limit were let in). Its hash went with the reap, so the next call
// answers a version Redis had already passed, and the instance records
// its leases again.
func TestInstanceTakenForDeadRecordsItsLeasesAgain(t *testing.T) {
	redistest.Each(t, testInstanceTakenForDeadRecordsItsLeasesAgain)
}

func testInstanceTakenForDeadRecordsItsLeasesAgain(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := confFor(t, tg)
	cfg.MaxInflight = 1
	cfg.LeaseTTL = time.Minute // no renewal during the test: the stall
	s := newStore(t, cfg, "p")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	la := sel(t, s, "a")
	id := s.ident.Load()
	if err := c.Do(ctx, c.B().Del().Key(id.alive).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	n, err := reapScript.Exec(ctx, c, []string{s.k.load, s.k.gone, id.alive, id.inst, s.k.insts}, []string{id.id}).AsInt64()
	if err != nil || n != 1 {
		t.Fatalf("reap: %d %v, want 1 request reclaimed", n, err)
	}
	lb := sel(t, s, "b") // its answer shows the records are gone
	waitFor(t, "both leases counted again", func() bool {
		return maps.Equal(mustCounts(t, s), map[string]int64{"a": 1, "b": 1})
	})
	la.Release(ok)
	lb.Release(ok)
	if !drained(t, s, c) {
		t.Fatalf("counts %v after both releases", mustCounts(t, s))
	}
}

// A backend set Redis acknowledged after the snapshot is undone too: the
// replica it added is no member any more, and picks that may only use it
// found none, until the next set change.
func TestRedisRollbackReplaysTheMemberSet(t *testing.T) {
	redistest.Each(t, testRedisRollbackReplaysTheMemberSet)
}

func testRedisRollbackReplaysTheMemberSet(t *testing.T, tg redistest.Target) {
	c := rawFor(t, tg)
	cfg := confFor(t, tg)
	cfg.MaxInflight = 1
	cfg.LeaseTTL = time.Minute // no renewal during the test
	s := newStore(t, cfg, "p")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	sn := takeSnapshot(t, c, s.k.tag)
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	sn.rollBack(t) // b is no member any more
	waitFor(t, "a pick of b", func() bool {
		l, err := s.Select(ctx, []string{"b"})
		if err != nil {
			return false
		}
		l.Release(ok)
		return true
	})
}
