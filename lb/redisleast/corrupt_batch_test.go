package redisleast

import (
	"context"
	"math"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// corruptBatchNumbers are values of an instance's field "#" (the number
// of its last batch applied) that no batch leaves: above every number an
// instance gives its batches (every batch read as applied already: its
// picks never counted, its releases never applied, for the instance's
// life), or not a number at all (every batch script failed on it).
var corruptBatchNumbers = []string{"inf", "1e300", "nan", "garbage", "18446744073709551616", "-1", "2.5"}

// plantBatchNumber sets field "#" of the instance hash inst, as an
// operator or a foreign client could.
func plantBatchNumber(t *testing.T, c rueidis.Client, inst, v string) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().Hset().Key(inst).FieldValue().FieldValue("#", v).Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// A corrupt "#" reads as unknown: the batch is applied, but a pick it
// finds recorded already is not counted again, so a batch whose reply
// was lost is still applied once when it goes again. "#" then holds the
// batch's number, and the next batches are numbered as before.
func TestCorruptBatchNumberDoesNotStick(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		for _, v := range corruptBatchNumbers {
			t.Run(v, func(t *testing.T) { testCorruptBatchNumberDoesNotStick(t, tg, v) })
		}
	})
}

func testCorruptBatchNumberDoesNotStick(t *testing.T, tg redistest.Target, v string) {
	s := newStore(t, confFor(t, tg), "corruptseq")
	ctx := context.Background()
	if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	c := rawFor(t, tg)
	id := s.ident.Load()
	bt := &batch{ident: id, seq: 1, cands: []string{"a", "b"},
		events: []event{{'+', "r1", "a"}, {'+', "r2", "a"}, {'-', "r1", "a"}, {'*', "r3", ""}}}
	plantBatchNumber(t, c, id.inst, v)
	r := batcherOf(s).send(bt)
	if r.err != nil {
		t.Fatalf("batch with \"#\" at %q: %v", v, r.err)
	}
	if r.picked != "b" || r.applied != 3 {
		t.Fatalf("batch with \"#\" at %q: exact pick %q, %d picks recorded; want b, 3", v, r.picked, r.applied)
	}
	wantCounts(t, s, map[string]int64{"a": 1, "b": 1})
	// Its reply lost, the batch goes again, with "#" corrupt again
	// meanwhile: it ran, its picks are recorded, none counts twice (r1,
	// released in the batch, is recorded and released again).
	plantBatchNumber(t, c, id.inst, v)
	if r := batcherOf(s).send(bt); r.err != nil || r.picked != "b" {
		t.Fatalf("the batch again (\"#\" at %q): picked %q, err %v; want b", v, r.picked, r.err)
	}
	wantCounts(t, s, map[string]int64{"a": 1, "b": 1})
	if r := batcherOf(s).send(&batch{ident: id, seq: 2, events: []event{{'-', "r2", "a"}, {'-', "r3", "b"}}}); r.err != nil {
		t.Fatal(r.err)
	}
	wantCounts(t, s, map[string]int64{"a": 0, "b": 0})
	if got, _ := c.Do(ctx, c.B().Hget().Key(id.inst).Field("#").Build()).ToString(); got != "2" {
		t.Fatalf("\"#\" = %q after batch 2", got)
	}
	if !drained(t, s, c) {
		t.Fatal("records left")
	}
}

// Through the store: with "#" corrupt, its picks are counted and its
// releases applied (not skipped, nor failing for good into local picks).
func TestCorruptBatchNumberKeepsTheInstanceCounted(t *testing.T) {
	for _, v := range corruptBatchNumbers {
		t.Run(v, func(t *testing.T) {
			addr := testRedis(t)
			s := newStore(t, testConfig(t, addr), "corruptseqstore")
			if err := s.Sync(context.Background(), []string{"a", "b"}); err != nil {
				t.Fatal(err)
			}
			sel(t, s, "a", "b").Release(ok) // "#" exists
			c := raw(t, addr)
			plantBatchNumber(t, c, s.ident.Load().inst, v)
			var held []*Lease
			for range 4 {
				held = append(held, sel(t, s, "a", "b"))
			}
			waitFor(t, "the picks in Redis", func() bool {
				n := mustCounts(t, s)
				return n["a"]+n["b"] == 4
			})
			for _, l := range held {
				l.Release(ok)
			}
			waitFor(t, "the releases in Redis", func() bool { return drained(t, s, c) })
			if st := s.Stats(); st.Fallbacks != 0 {
				t.Fatalf("%d local picks", st.Fallbacks)
			}
		})
	}
}

// The recount of a corrupt count in the queueing mode counts a slot just
// handed to a waiter of another instance (dispatch records it under the
// waiter's instance hash), and a replica removed while busy is counted
// again in gone.
func TestCorruptScoreIsCountedAgainAcrossAHandOver(t *testing.T) {
	redistest.Each(t, testCorruptScoreIsCountedAgainAcrossAHandOver)
}

func testCorruptScoreIsCountedAgainAcrossAHandOver(t *testing.T, tg redistest.Target) {
	st := queueStores(t, queueConfFor(t, tg), "x", "w")
	x, w := st[0], st[1]
	ctx := context.Background()
	if err := x.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	onA, onB := sel(t, x, "a"), sel(t, x, "b")
	c := rawFor(t, tg)
	out := make(chan got, 1)
	enqueue(t, ctx, c, w, "w1", out, "a", "b")
	// a's count goes corrupt while x holds its slot: the release counts a
	// again (0, its record dropped first) and the queue hands a to w1.
	plantScore(t, c, x.k.load, "a", math.Inf(-1))
	onA.Release(ok)
	g := <-out
	if g.err != nil {
		t.Fatal(g.err)
	}
	if g.l.Addr != "a" {
		t.Fatalf("w1 was handed %s, want a", g.l.Addr)
	}
	wantRawScores(t, c, x.k.load, map[string]float64{"a": 1, "b": 1})
	// Corrupt again; removed from the set, a takes to gone what the
	// records count: w1's, under w's hash.
	plantScore(t, c, x.k.load, "a", 0.5)
	if err := x.Sync(ctx, []string{"b"}); err != nil {
		t.Fatal(err)
	}
	wantRawScores(t, c, x.k.gone, map[string]float64{"a": 1})
	// Corrupt in gone: w1's release takes a out of it.
	plantScore(t, c, x.k.gone, "a", math.Inf(1))
	g.l.Release(ok)
	wantRawScores(t, c, x.k.gone, map[string]float64{})
	onB.Release(ok)
	if err := x.Sync(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	wantRawScores(t, c, x.k.load, map[string]float64{"a": 0, "b": 0})
	if !drained(t, x, c) || !queueEmpty(t, x, c) {
		t.Fatal("records or waiters left")
	}
}
