package redisleast

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// Two instances of one pool whose backend sets differ: set-backends
// reached instance A ({c, d}, now the pool's member set in Redis) and not
// yet instance B ({a, b}). None of B's candidates is a member in Redis,
// yet B has replicas of its own that are up: its picks are served from
// its own counts (not refused), each lease released once, locally; A's
// picks stay Redis picks. Once B gets A's set, its picks are Redis picks
// again.
func TestPicksWhileInstancesDisagreeOnTheSet(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		exact := confFor(t, tg)
		exact.CallRate = -1 // one select script per pick
		batched := confFor(t, tg)
		queue := queueConfFor(t, tg)
		for _, c := range []struct {
			name string
			cfg  Config
		}{{"exact", exact}, {"batched", batched}, {"queue", queue}} {
			t.Run(c.name, func(t *testing.T) {
				testPicksWhileInstancesDisagree(t, tg, c.cfg, "disagree-"+c.name)
			})
		}
	})
}

func testPicksWhileInstancesDisagree(t *testing.T, tg redistest.Target, cfg Config, pool string) {
	ca, cb := cfg, cfg
	ca.InstanceID, cb.InstanceID = "A", "B"
	a, b := newStore(t, ca, pool), newStore(t, cb, pool)
	warns := &warnings{}
	b.SetLogger(slog.New(warns))
	ownB, ownA := []string{"a:1", "b:1"}, []string{"c:1", "d:1"}
	b.SetReplicas(ownB)
	a.SetReplicas(ownA) // synced last: Redis holds {c, d}
	if err := b.SyncErr(); err != nil {
		t.Fatal(err)
	}
	if m := mustCounts(t, a); len(m) != 2 || !hasAll(m, ownA) {
		t.Fatalf("members in Redis %v, want %v", m, ownA)
	}
	pick := func(s *Store) (lb.Lease, *lb.Request) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req := &lb.Request{}
		l, err := s.Pick(ctx, req)
		if err != nil {
			t.Fatalf("%s: pick: %v", s.InstanceID(), err)
		}
		return l, req
	}
	reasons := map[string]int{}
	for range 20 {
		// One per replica at a time (the queue mode's max_inflight is 1):
		// B's own counts send the two to different replicas.
		var held []lb.Lease
		for range len(ownB) {
			l, req := pick(b)
			if !slices.Contains(ownB, l.Replica()) {
				t.Fatalf("B picked %s, not a replica of its own %v", l.Replica(), ownB)
			}
			reasons[req.Reason]++
			held = append(held, l)
		}
		if held[0].(*Lease).Fallback && held[1].(*Lease).Fallback && held[0].Replica() == held[1].Replica() {
			t.Fatalf("two local picks on %s with %s idle", held[0].Replica(), ownB)
		}
		la, _ := pick(a) // A's picks are untouched
		if !slices.Contains(ownA, la.Replica()) || la.(*Lease).Fallback {
			t.Fatalf("A picked %s (fallback %v)", la.Replica(), la.(*Lease).Fallback)
		}
		held = append(held, la)
		for _, l := range held {
			if !l.Release(ok) {
				t.Fatal("first release refused")
			}
			if l.Release(ok) {
				t.Fatal("second release counted")
			}
		}
	}
	t.Logf("B's picks: %v", reasons)
	if reasons[lb.ReasonLocalFallback] == 0 {
		t.Errorf("no pick of B served from its own counts: %v", reasons)
	}
	checkIdle := func() {
		t.Helper()
		for _, s := range []*Store{a, b} {
			if n := s.InFlight(); len(n) != 0 {
				t.Errorf("%s: local in flight %v after every release", s.InstanceID(), n)
			}
		}
		waitFor(t, "every release to reach Redis", func() bool { return drained(t, a, rawFor(t, tg)) })
	}
	checkIdle()
	mismatchChecks(t, a, b, reasons, warns)

	// B gets the new set: its picks are Redis picks again.
	b.SetReplicas(ownA)
	l, req := pick(b)
	if l.(*Lease).Fallback || req.Reason == lb.ReasonLocalFallback || !slices.Contains(ownA, l.Replica()) {
		t.Fatalf("after B got the set: picked %s, reason %s", l.Replica(), req.Reason)
	}
	waitFor(t, "B's pick counted in Redis", func() bool {
		var sum int64
		for _, n := range mustCounts(t, a) {
			sum += n
		}
		return sum == 1
	})
	l.Release(ok)
	checkIdle()
}

func hasAll(m map[string]int64, keys []string) bool {
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}

// mismatchChecks: B counted each local pick as a mismatch (none as a
// fallback: Redis answered) and warned once.
func mismatchChecks(t *testing.T, a, b *Store, reasons map[string]int, warns *warnings) {
	t.Helper()
	if st := b.Stats(); st.Mismatches != uint64(reasons[lb.ReasonLocalFallback]) || st.Fallbacks != 0 {
		t.Errorf("B: %d mismatches, %d fallbacks; %d local picks", st.Mismatches, st.Fallbacks, reasons[lb.ReasonLocalFallback])
	}
	if st := a.Stats(); st.Mismatches != 0 || st.Fallbacks != 0 {
		t.Errorf("A: %d mismatches, %d fallbacks", st.Mismatches, st.Fallbacks)
	}
	if got := warns.get(); len(got) != 1 || !strings.Contains(got[0], "a:1") || !strings.Contains(got[0], "c:1") {
		t.Errorf("warnings %q, want one naming B's candidates and Redis's members", got)
	}
}

// warnings collects what a store logs.
type warnings struct {
	mu  sync.Mutex
	got []string
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *warnings) WithGroup(string) slog.Handler            { return w }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	w.mu.Lock()
	w.got = append(w.got, b.String())
	w.mu.Unlock()
	return nil
}

func (w *warnings) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.got)
}
