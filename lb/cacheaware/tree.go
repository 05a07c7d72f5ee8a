package cacheaware

import (
	"strings"
	"unicode/utf8"
)

// node is one edge of a model's radix tree: label is the text after the
// parent's. One tree is shared by all replicas (a shared system prompt is
// stored once); holders says which replicas hold the node.
//
// Invariants: every node but the roots has at least one holder, and a
// node's holders include every holder of its children (inserting touches
// the whole path; eviction only drops leaf holdings). Labels are valid
// UTF-8 and copied out of request strings, so the tree pins no request.
type node struct {
	label   string
	runes   int32   // runeCount(label): the size unit
	first   rune    // first rune of label: children are found by it
	parent  *node   // nil for a root
	kids    []*node // see kids.go: sorted by first rune, or a table
	holders []*holding
}

func newNode(label string, parent *node) *node {
	r, _ := utf8.DecodeRuneInString(label)
	return &node{label: label, runes: int32(runeCount(label)), first: r, parent: parent}
}

func (n *node) holdingOf(rep *replica) *holding {
	for _, h := range n.holders {
		if h.rep == rep {
			return h
		}
	}
	return nil
}

// live reports whether a replica still in the set holds n (a removed
// replica's holdings may linger while SetReplicas drops them in batches).
func (n *node) live() bool {
	for _, h := range n.holders {
		if !h.rep.dead {
			return true
		}
	}
	return false
}

// commonPrefix returns the length in bytes of the longest common prefix of
// a and b that ends on a rune boundary.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i < len(a) && i < len(b) {
		for i > 0 && !utf8.RuneStart(a[i]) {
			i--
		}
	}
	return i
}

// heldBy reports whether a replica still in the set that usable (by
// Router.order index) marks holds n.
func (n *node) heldBy(usable []bool) bool {
	for _, h := range n.holders {
		if !h.rep.dead && usable[h.rep.idx] {
			return true
		}
	}
	return false
}

// match walks text down root and returns the deepest node that a live
// replica holds and text reaches (fully or partly), and the number of
// runes matched down to there. The node's live holders are exactly the
// replicas with the longest match (holders of a child are holders of the
// parent).
func match(root *node, text string) (best *node, matched int) {
	return matchFor(root, text, nil)
}

// matchFor is match among the replicas usable marks (nil: every live
// one): a longest match held only by replicas that may not get the
// request must not hide a shorter one that a usable replica holds.
func matchFor(root *node, text string, usable []bool) (best *node, matched int) {
	n := root
	for len(text) > 0 {
		c, _ := utf8.DecodeRuneInString(text)
		kid := n.child(c)
		if kid == nil || (usable == nil && !kid.live()) || (usable != nil && !kid.heldBy(usable)) {
			break
		}
		best = kid
		if strings.HasPrefix(text, kid.label) {
			matched += int(kid.runes)
			text = text[len(kid.label):]
			n = kid
			continue
		}
		matched += runeCount(text[:commonPrefix(kid.label, text)])
		break
	}
	return best, matched
}

// insertLocked records that rep now holds text below root, creating and
// splitting nodes as needed, and moves the path's holdings to the front of
// both recency lists in path order (parent first).
func (r *Router) insertLocked(root *node, text string, rep *replica) {
	atG, atR := &r.lru, &rep.lru
	n := root
	for len(text) > 0 {
		c, _ := utf8.DecodeRuneInString(text)
		kid := n.child(c)
		if kid == nil {
			leaf := newNode(strings.Clone(text), n)
			n.addKid(leaf)
			r.size += int(leaf.runes)
			r.nodes++
			r.hold(leaf, rep, atG, atR)
			return
		}
		l := len(kid.label)
		if !strings.HasPrefix(text, kid.label) {
			l = commonPrefix(kid.label, text)
			kid = r.split(n, kid, l)
		}
		h := kid.holdingOf(rep)
		if h == nil {
			h = r.hold(kid, rep, atG, atR)
		} else {
			placeAfter(atG, atR, h)
		}
		atG, atR = h, h
		text = text[l:]
		n = kid
	}
}

// hold adds rep as a holder of n, placed just behind atG/atR.
func (r *Router) hold(n *node, rep *replica, atG, atR *holding) *holding {
	h := &holding{node: n, rep: rep}
	n.holders = append(n.holders, h)
	rep.chars += int(n.runes)
	placeAfter(atG, atR, h)
	return h
}

// split cuts old, a child of parent, after l bytes (0 < l < len(label),
// on a rune boundary) into a new prefix node and the old node, now its
// only child. Every holder of the old node holds the prefix; each new
// holding goes just in front of the old one, which keeps the order
// invariant. Sizes do not change. Both halves are copied so neither pins
// the other's bytes.
func (r *Router) split(parent, old *node, l int) *node {
	p := newNode(strings.Clone(old.label[:l]), parent)
	parent.replaceKid(old, p) // while old still starts with p's rune
	p.kids = []*node{old}
	p.holders = make([]*holding, len(old.holders))
	for j, h := range old.holders {
		ph := &holding{node: p, rep: h.rep}
		placeAfter(h.gprev, h.rprev, ph)
		p.holders[j] = ph
	}
	old.label = strings.Clone(old.label[l:])
	old.runes -= p.runes
	old.first, _ = utf8.DecodeRuneInString(old.label)
	old.parent = p
	r.nodes++
	return p
}

// drop removes holding h (a leaf holding for its replica: see holding) and,
// when h was the node's last holder, the node itself, which then has no
// children. It returns the characters freed from the tree.
func (r *Router) drop(h *holding) int {
	n := h.node
	unlink(h)
	h.rep.chars -= int(n.runes)
	for j, x := range n.holders {
		if x == h {
			last := len(n.holders) - 1
			n.holders[j] = n.holders[last]
			n.holders[last] = nil
			n.holders = n.holders[:last]
			break
		}
	}
	if len(n.holders) > 0 {
		return 0
	}
	if len(n.kids) > 0 {
		panic("cacheaware: tree corrupt: unheld node has children")
	}
	p := n.parent
	p.removeKid(n)
	n.parent = nil
	r.size -= int(n.runes)
	r.nodes--
	if p.parent == nil && len(p.kids) == 0 {
		// An empty tree goes and frees its name's cost, so
		// request-supplied model names cannot grow the map without bound.
		r.names -= treeCost(r.roots[p])
		delete(r.trees, r.roots[p])
		delete(r.roots, p)
	}
	return int(n.runes)
}
