package cacheaware

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// distinctRunes returns n distinct valid runes (no surrogates, which text
// validation would replace), from U+0100 up.
func distinctRunes(n int) []rune {
	out := make([]rune, 0, n)
	for c := rune(0x100); len(out) < n; c++ {
		if c >= 0xD800 && c <= 0xDFFF {
			continue
		}
		out = append(out, c)
	}
	return out
}

// kidSlots is a copy of where n keeps its children (the whole backing
// array: a table uses all of it) and which array that is.
type kidSlots struct {
	array **node
	slots []*node
}

func slotsOf(n *node) kidSlots {
	return kidSlots{unsafe.SliceData(n.kids), slices.Clone(n.kids[:cap(n.kids)])}
}

// movedSince counts the child pointers moved since before was taken: each
// slot whose content changed, or every child when the array was replaced
// (they were all copied).
func (before kidSlots) movedSince(n *node) int {
	moved := 0
	if unsafe.SliceData(n.kids) != before.array {
		for _, k := range before.slots {
			if k != nil {
				moved++
			}
		}
		return moved
	}
	for i, k := range n.kids[:cap(n.kids)] {
		if k != before.slots[i] {
			moved++
		}
	}
	return moved
}

// Prompts that each start with a different character give a node one
// child per character, up to ~1.1M. Adding a child or evicting one must
// not move its siblings: a sorted slice shifted up to all of them under
// the write lock on every insert, a CPU denial of service. This counts
// the child pointers moved (not time), at the root and at an inner node,
// with the tree full so every insert also evicts a child.
func TestWideNodeInsertMovesFewChildren(t *testing.T) {
	const width, ops = 2000, 1000
	// A sorted slice of at most 16 children moves at most 16 per op; the
	// old sorted slice of 2000 moved ~700 on average.
	const fewPerOp = 16
	runes := distinctRunes(width + ops)
	rand.New(rand.NewPCG(5, 5)).Shuffle(len(runes), func(i, j int) { runes[i], runes[j] = runes[j], runes[i] })
	for _, prefix := range []string{"", "system: "} {
		t.Run(fmt.Sprintf("prefix=%q", prefix), func(t *testing.T) {
			r := newRouter(t, Config{MaxTreeSize: len(prefix) + width}, "a", "b")
			for i, c := range runes[:width] {
				r.Insert("m", prefix+string(c), []string{"a", "b"}[i%2])
			}
			check(t, r)
			n := r.trees["m"]
			if prefix != "" {
				n, _ = match(n, prefix)
			}
			if n == nil || n.label != prefix || len(n.kids) != width {
				t.Fatalf("setup: no node %q with %d children", prefix, width)
			}
			moved := 0
			for i, c := range runes[width:] {
				before := slotsOf(n)
				r.Insert("m", prefix+string(c), []string{"a", "b"}[i%2])
				moved += before.movedSince(n)
			}
			check(t, r)
			t.Logf("%d inserts moved %d child pointers", ops, moved)
			if moved > ops*fewPerOp {
				t.Fatalf("%d inserts (each evicting a sibling) moved %d child pointers of a node with %d children, want at most %d",
					ops, moved, width, ops*fewPerOp)
			}
			// Lookups still find every child kept, and none evicted.
			for i, c := range runes {
				_, m := holdersOf(r, "m", prefix+string(c)+"tail")
				if kept := i >= ops; m != len(prefix)+1 && kept || m != len(prefix) && !kept {
					t.Fatalf("rune %d (kept %v) matched %d", i, kept, m)
				}
			}
			// Shrinking the bound leaves a narrow node behind; emptying the
			// replica set frees the tree.
			r.Configure(Config{MaxTreeSize: len(prefix) + 5})
			check(t, r)
			if s := r.Stats(); s.Chars != len(prefix)+5 {
				t.Fatalf("after shrinking: %d chars, want %d", s.Chars, len(prefix)+5)
			}
			r.SetReplicas(nil)
			check(t, r)
			if s := r.Stats(); s.Models != 0 || s.Nodes != 0 {
				t.Fatalf("after removing every replica: %+v", s)
			}
		})
	}
}

// TestWideNodesRandom is TestBoundNeverExceededRandom over an alphabet
// wide enough that nodes switch between few and many children, are split
// and evicted in both forms, with every invariant checked after each step.
func TestWideNodesRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := append([]rune("abcé日"), distinctRunes(150)...)
	prefixes := []string{"", "a", "sys: ", "日本: "}
	for _, max := range []int{60, 600, 4000} {
		r := newRouter(t, Config{MaxTreeSize: max}, "r0", "r1", "r2")
		for i := range 2500 {
			var sb strings.Builder
			sb.WriteString(prefixes[rng.IntN(len(prefixes))])
			// Mostly one or two characters under a prefix: wide nodes; at
			// times longer: splits of their children.
			for range 1 + rng.IntN(2) + rng.IntN(2)*rng.IntN(6) {
				sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
			}
			r.Insert(fmt.Sprint("m", rng.IntN(2)), sb.String(), fmt.Sprint("r", rng.IntN(3)))
			if i%5 == 0 {
				check(t, r)
			}
			switch rng.IntN(300) {
			case 0:
				r.SetReplicas([]string{"r0", "r2"})
				check(t, r)
				r.SetReplicas([]string{"r0", "r1", "r2"})
			case 1:
				r.EvictOnce()
				check(t, r)
			}
		}
		check(t, r)
	}
}
