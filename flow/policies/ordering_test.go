package policies

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// randomItems draws items whose times collide often (few distinct
// values), so the tie-breaks are exercised, and some have no deadline.
func randomItems(rng *rand.Rand, n int) []*Item {
	items := make([]*Item, n)
	for i := range items {
		it := &Item{Seq: uint64(i + 1), Arrival: t0.Add(time.Duration(rng.IntN(5)) * time.Second)}
		if rng.IntN(4) > 0 {
			it.Deadline = t0.Add(time.Duration(rng.IntN(5)) * time.Second)
		}
		if rng.IntN(3) > 0 {
			it.SLODeadline = t0.Add(time.Duration(rng.IntN(5)) * time.Second)
		}
		items[i] = it
	}
	rng.Shuffle(n, func(i, j int) { items[i], items[j] = items[j], items[i] })
	return items
}

// TestOrderingConformance runs the OrderingPolicy contract against every
// registered policy: a strict total order, and a Queue that pops in that
// order whatever was removed from the middle.
func TestOrderingConformance(t *testing.T) {
	for _, name := range OrderingNames() {
		t.Run(name, func(t *testing.T) {
			p, err := NewOrdering(name)
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != name {
				t.Fatalf("Name() = %q, registered as %q", p.Name(), name)
			}
			rng := rand.New(rand.NewPCG(1, uint64(len(name))))
			items := randomItems(rng, 60)
			for _, a := range items {
				if p.Less(a, a) {
					t.Fatalf("Less(a, a) for seq %d", a.Seq)
				}
				for _, b := range items {
					if a == b {
						continue
					}
					if p.Less(a, b) == p.Less(b, a) {
						t.Fatalf("not total/asymmetric on seq %d, %d", a.Seq, b.Seq)
					}
					for _, c := range items[:15] {
						if p.Less(a, b) && p.Less(b, c) && !p.Less(a, c) {
							t.Fatalf("not transitive on seq %d < %d < %d", a.Seq, b.Seq, c.Seq)
						}
					}
				}
			}

			q := NewQueue("f", p)
			for _, it := range items {
				q.Push(it)
			}
			removed := map[*Item]bool{}
			for _, it := range items[:20] {
				if !q.Remove(it) {
					t.Fatalf("Remove(seq %d) = false for a queued item", it.Seq)
				}
				if it.Queued() || q.Remove(it) {
					t.Fatalf("seq %d still queued after Remove", it.Seq)
				}
				removed[it] = true
			}
			want := slices.DeleteFunc(slices.Clone(items), func(it *Item) bool { return removed[it] })
			slices.SortFunc(want, func(a, b *Item) int {
				if p.Less(a, b) {
					return -1
				}
				return 1
			})
			for i, w := range want {
				if h := q.Head(); h != w {
					t.Fatalf("pop %d: head seq %d, want %d", i, h.Seq, w.Seq)
				}
				if got := q.Pop(); got != w {
					t.Fatalf("pop %d: got seq %d, want %d", i, got.Seq, w.Seq)
				}
			}
			if q.Len() != 0 || q.Pop() != nil || q.Head() != nil {
				t.Fatal("queue not empty after popping everything")
			}
		})
	}
}

func popSeqs(q *Queue) []uint64 {
	var out []uint64
	for q.Len() > 0 {
		out = append(out, q.Pop().Seq)
	}
	return out
}

func TestFCFSOrder(t *testing.T) {
	p, _ := NewOrdering(FCFS)
	q := NewQueue("f", p)
	// Arrival is ignored: two goroutines may read the clock out of order.
	q.Push(&Item{Seq: 3, Arrival: t0})
	q.Push(&Item{Seq: 1, Arrival: t0.Add(time.Second)})
	q.Push(&Item{Seq: 2, Arrival: t0})
	if got := popSeqs(q); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("order %v", got)
	}
}

func TestEDFOrder(t *testing.T) {
	p, _ := NewOrdering(EDF)
	q := NewQueue("f", p)
	q.Push(&Item{Seq: 1, Deadline: t0.Add(60 * time.Second)})
	q.Push(&Item{Seq: 2, Deadline: t0.Add(5 * time.Second)})
	q.Push(&Item{Seq: 3}) // no deadline: last
	q.Push(&Item{Seq: 4, Deadline: t0.Add(5 * time.Second)})
	q.Push(&Item{Seq: 5, Deadline: t0.Add(30 * time.Second)})
	if got := popSeqs(q); !slices.Equal(got, []uint64{2, 4, 5, 1, 3}) {
		t.Fatalf("order %v", got)
	}
}

func TestSLODeadlineOrder(t *testing.T) {
	p, _ := NewOrdering(SLODeadline)
	q := NewQueue("f", p)
	q.Push(&Item{Seq: 1})                                     // no SLO
	q.Push(&Item{Seq: 2, SLODeadline: t0.Add(time.Second)})   // tight SLO
	q.Push(&Item{Seq: 3})                                     // no SLO
	q.Push(&Item{Seq: 4, SLODeadline: t0.Add(time.Minute)})   // loose SLO, still before no-SLO
	q.Push(&Item{Seq: 5, SLODeadline: t0.Add(time.Second)})   // tie with 2: FCFS
	q.Push(&Item{Seq: 6, Deadline: t0.Add(time.Millisecond)}) // TTL deadline is not an SLO
	if got := popSeqs(q); !slices.Equal(got, []uint64{2, 5, 4, 1, 3, 6}) {
		t.Fatalf("order %v", got)
	}
}

func TestUnknownPolicies(t *testing.T) {
	if _, err := NewOrdering("lifo"); err == nil {
		t.Fatal("unknown ordering accepted")
	}
	if _, err := NewFairness("lottery", fcfs{}); err == nil {
		t.Fatal("unknown fairness accepted")
	}
}

func TestQueuePushTwicePanics(t *testing.T) {
	q := NewQueue("f", fcfs{})
	it := &Item{Seq: 1}
	q.Push(it)
	defer func() {
		if recover() == nil {
			t.Fatal("second Push of a queued item did not panic")
		}
	}()
	NewQueue("g", fcfs{}).Push(it)
}
