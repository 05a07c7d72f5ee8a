package policies

import (
	"math/rand/v2"
	"testing"
	"time"
)

// band is a minimal framework for the contract tests: flows that call the
// policy's Update after every change, as package flow does.
type band struct {
	t     *testing.T
	p     FairnessPolicy
	ord   OrderingPolicy
	flows map[string]*Queue
	seq   uint64
}

func newBand(t *testing.T, fair, ord string) *band {
	o, err := NewOrdering(ord)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewFairness(fair, o)
	if err != nil {
		t.Fatal(err)
	}
	return &band{t: t, p: p, ord: o, flows: map[string]*Queue{}}
}

func (b *band) push(flow string, it *Item) {
	q := b.flows[flow]
	if q == nil {
		q = NewQueue(flow, b.ord)
		b.flows[flow] = q
	}
	b.seq++
	it.Seq = b.seq
	q.Push(it)
	b.p.Update(q, false)
}

func (b *band) remove(it *Item) {
	for id, q := range b.flows {
		if q.Remove(it) {
			b.p.Update(q, false)
			if q.Len() == 0 {
				delete(b.flows, id) // the framework drops empty flows
			}
			return
		}
	}
	b.t.Fatalf("seq %d not found", it.Seq)
}

// serve dispatches the next request, checking the contract on the way.
func (b *band) serve() (string, *Item) {
	q := b.p.Next()
	if q == nil {
		if b.backlog() != 0 {
			b.t.Fatalf("Next() = nil with %d queued", b.backlog())
		}
		return "", nil
	}
	if b.p.Next() != q {
		b.t.Fatal("Next() changed without an Update")
	}
	if q.Len() == 0 || b.flows[q.ID] != q {
		b.t.Fatalf("Next() returned flow %q that is empty or unknown", q.ID)
	}
	it := q.Pop()
	b.p.Update(q, true)
	if q.Len() == 0 {
		delete(b.flows, q.ID)
	}
	return q.ID, it
}

func (b *band) backlog() int {
	n := 0
	for _, q := range b.flows {
		n += q.Len()
	}
	return n
}

// TestFairnessConformance runs the FairnessPolicy contract against every
// registered policy under every ordering: random pushes, removals and
// dispatches; Next is nil exactly when the band is empty, only names
// backlogged flows, is stable between updates, and every item leaves
// exactly once.
func TestFairnessConformance(t *testing.T) {
	for _, fair := range FairnessNames() {
		for _, ord := range OrderingNames() {
			t.Run(fair+"/"+ord, func(t *testing.T) {
				b := newBand(t, fair, ord)
				if b.p.Name() != fair {
					t.Fatalf("Name() = %q", b.p.Name())
				}
				if b.p.Next() != nil {
					t.Fatal("Next() on an empty band is not nil")
				}
				rng := rand.New(rand.NewPCG(7, 9))
				flows := []string{"a", "b", "c", "d", "e"}
				var live []*Item
				seen := map[*Item]bool{}
				pushed := 0
				for step := 0; step < 3000; step++ {
					switch r := rng.IntN(10); {
					case r < 5:
						it := &Item{Arrival: t0, Deadline: t0.Add(time.Duration(rng.IntN(50)) * time.Second)}
						if rng.IntN(2) == 0 {
							it.SLODeadline = t0.Add(time.Duration(rng.IntN(50)) * time.Second)
						}
						b.push(flows[rng.IntN(len(flows))], it)
						live = append(live, it)
						pushed++
					case r < 6 && len(live) > 0:
						i := rng.IntN(len(live))
						it := live[i]
						if it.Queued() {
							b.remove(it)
							seen[it] = true
						}
						live = append(live[:i], live[i+1:]...)
					default:
						if _, it := b.serve(); it != nil {
							if seen[it] {
								b.t.Fatalf("seq %d left twice", it.Seq)
							}
							seen[it] = true
						}
					}
				}
				for {
					_, it := b.serve()
					if it == nil {
						break
					}
					if seen[it] {
						t.Fatalf("seq %d left twice", it.Seq)
					}
					seen[it] = true
				}
				if len(seen) != pushed {
					t.Fatalf("%d items pushed, %d left", pushed, len(seen))
				}
			})
		}
	}
}

func TestRoundRobinEqualTurns(t *testing.T) {
	b := newBand(t, RoundRobin, FCFS)
	for i := 0; i < 100; i++ {
		b.push("heavy", &Item{})
		if i%10 == 0 {
			b.push("light", &Item{})
		}
	}
	counts := map[string]int{}
	var order []string
	for i := 0; i < 20; i++ {
		id, _ := b.serve()
		counts[id]++
		order = append(order, id)
	}
	if counts["heavy"] != 10 || counts["light"] != 10 {
		t.Fatalf("turns %v (order %v), want 10 each", counts, order)
	}
	for i := 1; i < len(order); i++ {
		if order[i] == order[i-1] {
			t.Fatalf("flow %q served twice in a row while both backlogged: %v", order[i], order)
		}
	}
}

func TestRoundRobinRejoinsAtBack(t *testing.T) {
	b := newBand(t, RoundRobin, FCFS)
	b.push("a", &Item{})
	b.push("b", &Item{})
	b.push("b", &Item{})
	if id, _ := b.serve(); id != "a" { // a drains and leaves the ring
		t.Fatalf("first turn %q", id)
	}
	b.push("a", &Item{}) // a comes back behind b
	var order []string
	for id, it := b.serve(); it != nil; id, it = b.serve() {
		order = append(order, id)
	}
	if len(order) != 3 || order[0] != "b" || order[1] != "a" || order[2] != "b" {
		t.Fatalf("order %v, want [b a b]", order)
	}
}

func TestGlobalStrictServesGlobalOrder(t *testing.T) {
	b := newBand(t, GlobalStrict, EDF)
	dl := func(s int) *Item { return &Item{Deadline: t0.Add(time.Duration(s) * time.Second)} }
	b.push("a", dl(30))
	b.push("a", dl(10))
	b.push("b", dl(20))
	b.push("c", dl(5))
	b.push("b", dl(1))
	var got []int
	for _, it := b.serve(); it != nil; _, it = b.serve() {
		got = append(got, int(it.Deadline.Sub(t0)/time.Second))
	}
	want := []int{1, 5, 10, 20, 30}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("deadlines served %v, want %v", got, want)
		}
	}
}
