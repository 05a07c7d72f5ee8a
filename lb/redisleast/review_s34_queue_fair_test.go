package redisleast

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// A waiter handed a slot that its instance's passive health refuses (the
// replica failed on that instance after the waiter queued) keeps its
// place in the queue, less that replica: it is not put behind the
// requests that queued after it. Here x's w1 queued first for a or b;
// y's y1 and y2 queued after it. a then failed on x, and a's freed slot
// went to w1, which x refused (a's slot goes on to y1). The next free
// slot, b's, is w1's: it has waited longest and may use it.
func TestReviewS34RefusedHandOverKeepsItsPlace(t *testing.T) {
	addr := testRedis(t)
	cfg := queueConfig(t, addr)
	cfg.FailDuration = time.Minute
	st := queueStores(t, cfg, "x", "y")
	x, y := st[0], st[1]
	ctx := context.Background()
	c := raw(t, addr)
	for _, s := range st {
		if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
	}
	ha, hb := sel(t, y, "a"), sel(t, y, "b")
	out := make(chan got, 3)
	enqueue(t, ctx, c, x, "w1", out, "a", "b")
	enqueue(t, ctx, c, y, "y1", out, "a", "b")
	enqueue(t, ctx, c, y, "y2", out, "a", "b")

	x.health.Acquire("a").Release(failed) // a fails on x: down there for a minute
	if !x.health.Down("a") {
		t.Fatal("a is not down on x")
	}
	ha.Release(ok) // handed to w1, refused by x, then handed to y1
	first := <-out
	if first.err != nil || first.name != "y1" || first.l.Addr != "a" {
		t.Fatalf("a's slot: %s %+v %v, want y1 on a", first.name, first.l, first.err)
	}
	hb.Release(ok)
	second := <-out
	if second.err != nil {
		t.Fatalf("%s: %v", second.name, second.err)
	}
	if second.name != "w1" {
		t.Errorf("b's slot went to %s, want w1 (queued before it, refused a only)", second.name)
	}
	if second.l.Addr != "b" {
		t.Errorf("%s got %s, want b", second.name, second.l.Addr)
	}
	first.l.Release(ok)
	second.l.Release(ok)
	third := <-out
	if third.err != nil {
		t.Fatalf("%s: %v", third.name, third.err)
	}
	third.l.Release(ok)
	waitFor(t, "the queue to empty and every count back to 0", func() bool {
		return queueEmpty(t, x, c) && hlen(t, c, x.k.cands) == 0 && drained(t, x, c)
	})
	if n := hlen(t, c, x.k.tag+":qseq"); n != 1 {
		t.Errorf("%s holds %d fields once the queue is empty, want 1 (the counter)", x.k.tag+":qseq", n)
	}
	for _, s := range st {
		if s := s.Stats(); s.Selections != s.Releases {
			t.Fatalf("stats %+v: selections != releases", s)
		}
	}
	// one request queued once (and its QueueTimeout counted once, from
	// its arrival), not a second time at the tail
	if n := x.Stats().QueuedTotal; n != 1 {
		t.Errorf("x counts %d requests queued, want 1 (w1)", n)
	}
}

// BenchmarkReviewS34Queue measures the queue's work per operation with n
// waiters of x queued for a (held), one op being:
//
//   - handover: a release of a slot of a that hands it to the head waiter
//     (the benchmark then holds it), and one waiter joining the tail;
//   - blocked: a release of b, handed to y's one waiter, queued for b
//     behind all of x's (which may not use it), and y's next waiter
//     joining the tail;
//   - cancel: y's waiter, at the tail, joining and leaving the queue.
func BenchmarkReviewS34Queue(b *testing.B) {
	addr := testRedis(b)
	for _, kind := range []string{"handover", "blocked", "cancel"} {
		for _, n := range []int{10, 100, 1000} {
			b.Run(fmt.Sprintf("%s/waiters=%d", kind, n), func(b *testing.B) {
				benchQueue(b, addr, kind, n)
			})
		}
	}
}

func mustSelect(b *testing.B, s *Store, cands ...string) *Lease {
	l, err := s.Select(context.Background(), cands)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

func benchQueue(b *testing.B, addr, kind string, n int) {
	cfg := queueConfig(b, addr)
	cfg.QueueTimeout = time.Hour
	st := queueStores(b, cfg, "x", "y")
	x, y := st[0], st[1]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := raw(b, addr)
	for _, s := range st {
		if err := s.Sync(ctx, []string{"a", "b"}); err != nil {
			b.Fatal(err)
		}
	}
	held := mustSelect(b, x, "a")
	hb := mustSelect(b, y, "b")
	handed := make(chan *Lease, n+1)
	queueX := func() {
		go func() {
			l, err := x.Select(ctx, []string{"a"})
			if err == nil {
				handed <- l
			}
		}()
	}
	for range n {
		queueX()
	}
	waitFor(b, "the waiters to queue", func() bool { return hlen(b, c, x.k.waiters) == int64(n) })
	poll := func(what string, cond func() bool) {
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				b.Fatalf("gave up waiting for %s", what)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		switch kind {
		case "handover":
			held.Release(ok)
			held = <-handed
			queueX()
			poll("the waiter to queue", func() bool { return hlen(b, c, x.k.waiters) == int64(n) })
		case "blocked":
			got := make(chan *Lease, 1)
			go func() {
				l, _ := y.Select(ctx, []string{"b"})
				got <- l
			}()
			poll("y to queue", func() bool { return hlen(b, c, x.k.waiters) == int64(n+1) })
			hb.Release(ok)
			if hb = <-got; hb == nil {
				b.Fatal("y's waiter got no slot")
			}
		case "cancel":
			wctx, wcancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := y.Select(wctx, []string{"a"})
				done <- err
			}()
			poll("y to queue", func() bool { return hlen(b, c, x.k.waiters) == int64(n+1) })
			wcancel()
			if err := <-done; err == nil {
				b.Fatalf("op %d: the cancelled waiter got a slot", i)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(scriptMicros(b, c)/float64(b.N), "redis-script-µs/op")
	cancel()
	held.Release(ok)
	hb.Release(ok)
}

// scriptMicros is the time Redis spent running scripts since the last
// CONFIG RESETSTAT, in µs.
func scriptMicros(b *testing.B, c rueidis.Client) float64 {
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[strings.Index(line, ":")+1:]), ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += n
			}
		}
	}
	return total
}
