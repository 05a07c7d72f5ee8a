package cacheaware

import (
	"cmp"
	"hash/maphash"
	"iter"
	"slices"
)

// A node's children are found by their first rune (siblings' differ).
// Most nodes have a few, kept in kids sorted by first rune: binary search
// finds one, and adding or removing one shifts at most maxSortedKids
// pointers. But prompts are the clients' to choose: prompts that each
// start with a different character give a node up to ~1.1M children, and
// a sorted slice would then move megabytes of pointers per insert or
// eviction under the tree's write lock. So a node with more children
// keeps them in a hash table, where adding or removing one costs the same
// however many siblings it has.
//
// The table lives in kids too, so the nodes with few children (nearly
// all) pay no field for it: node is 80 bytes, a size class, and one more
// field would make every node 96. A node is wide when cap(kids) >
// maxSortedKids; then kids[:cap(kids)] is an open-addressing table
// (linear probing, nil for a free slot, a power-of-two size at most half
// full) and len(kids) the number of children, as in the sorted form.
const (
	maxSortedKids = 16
	// minKidTable is the smallest table: a power of two, more than twice
	// maxSortedKids. A table of it narrows back at maxSortedKids/2
	// children, so a node is not converted back and forth on every
	// change around one count.
	minKidTable = 64
)

// kidSeed keys the table's hash, so clients cannot choose first runes
// that collide in it.
var kidSeed = maphash.MakeSeed()

func (n *node) wide() bool { return cap(n.kids) > maxSortedKids }

// slots is where n keeps its children: the sorted slice, or the table.
func (n *node) slots() []*node {
	if n.wide() {
		return n.kids[:cap(n.kids)]
	}
	return n.kids
}

// allKids yields n's children, in no particular order.
func (n *node) allKids() iter.Seq[*node] {
	return func(yield func(*node) bool) {
		for _, k := range n.slots() {
			if k != nil && !yield(k) {
				return
			}
		}
	}
}

// homeSlot is where a table of size slots starts probing for first rune c.
func homeSlot(c rune, size int) int {
	return int(maphash.Comparable(kidSeed, c) & uint64(size-1))
}

// child returns n's child starting with rune c, or nil.
func (n *node) child(c rune) *node {
	if n.wide() {
		t := n.kids[:cap(n.kids)]
		for i := homeSlot(c, len(t)); ; i = (i + 1) & (len(t) - 1) {
			if k := t[i]; k == nil || k.first == c {
				return k
			}
		}
	}
	i, ok := n.sortedIndex(c)
	if !ok {
		return nil
	}
	return n.kids[i]
}

// sortedIndex finds the child starting with rune c in the sorted form, or
// where to insert one.
func (n *node) sortedIndex(c rune) (int, bool) {
	lo, hi := 0, len(n.kids)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if n.kids[m].first < c {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(n.kids) && n.kids[lo].first == c
}

// kidSlot returns the index of child k in n.slots().
func (n *node) kidSlot(k *node) int {
	if n.wide() {
		t := n.kids[:cap(n.kids)]
		for i := homeSlot(k.first, len(t)); t[i] != nil; i = (i + 1) & (len(t) - 1) {
			if t[i] == k {
				return i
			}
		}
	} else if i, ok := n.sortedIndex(k.first); ok && n.kids[i] == k {
		return i
	}
	panic("cacheaware: tree corrupt: child not found")
}

// addKid adds k, whose first rune no child of n has.
func (n *node) addKid(k *node) {
	if !n.wide() && len(n.kids) < maxSortedKids {
		i, _ := n.sortedIndex(k.first)
		if len(n.kids) == cap(n.kids) {
			// Grown here, not by append, so that the capacity never
			// passes maxSortedKids (which would mark a table).
			grown := make([]*node, len(n.kids), min(max(2*cap(n.kids), 1), maxSortedKids))
			copy(grown, n.kids)
			n.kids = grown
		}
		n.kids = n.kids[:len(n.kids)+1]
		copy(n.kids[i+1:], n.kids[i:])
		n.kids[i] = k
		return
	}
	if size := cap(n.kids); 2*(len(n.kids)+1) > size {
		n.rehash(max(2*size, minKidTable))
	}
	put(n.kids[:cap(n.kids)], k)
	n.kids = n.kids[:len(n.kids)+1]
}

// removeKid removes child k from n.
func (n *node) removeKid(k *node) {
	i := n.kidSlot(k)
	if !n.wide() {
		copy(n.kids[i:], n.kids[i+1:])
		n.kids[len(n.kids)-1] = nil
		n.kids = n.kids[:len(n.kids)-1]
		return
	}
	// Backward-shift deletion: later entries of the probe run move into
	// the hole where their home slot allows, so that lookups, which stop
	// at a free slot, need no markers for removed entries.
	t := n.kids[:cap(n.kids)]
	mask := len(t) - 1
	for j := (i + 1) & mask; t[j] != nil; j = (j + 1) & mask {
		// t[j] may fill the hole unless its home lies in (i, j].
		if home := homeSlot(t[j].first, len(t)); (j-home)&mask >= (j-i)&mask {
			t[i] = t[j]
			i = j
		}
	}
	t[i] = nil
	n.kids = n.kids[:len(n.kids)-1]
	// Shrinking at an eighth full and growing at half full leave at
	// least a quarter of a table's slots in changes between rebuilds, so
	// rebuilding costs a few pointer moves per change on average.
	switch count := len(n.kids); {
	case count <= maxSortedKids/2:
		sorted := make([]*node, 0, maxSortedKids)
		sorted = slices.AppendSeq(sorted, n.allKids())
		slices.SortFunc(sorted, func(a, b *node) int { return cmp.Compare(a.first, b.first) })
		n.kids = sorted
	case 8*count < len(t):
		n.rehash(len(t) / 2)
	}
}

// replaceKid puts k in the place of n's child old, which starts with the
// same rune.
func (n *node) replaceKid(old, k *node) {
	n.slots()[n.kidSlot(old)] = k
}

// rehash moves n's children into a new table of size slots.
func (n *node) rehash(size int) {
	t := make([]*node, size)
	for k := range n.allKids() {
		put(t, k)
	}
	n.kids = t[:len(n.kids)]
}

// put adds k to table t, which has a free slot and no entry for its
// first rune.
func put(t []*node, k *node) {
	i := homeSlot(k.first, len(t))
	for t[i] != nil {
		i = (i + 1) & (len(t) - 1)
	}
	t[i] = k
}
