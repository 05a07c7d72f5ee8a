package cacheaware

// holding records that one replica holds one node: the router believes the
// replica has the node's text (after its ancestors') cached. Every holding
// is linked into two recency lists, the router's and its replica's, most
// recent first. Intrusive links keep touch and eviction O(1) with no
// allocation.
//
// Order invariant, kept by touch (path order) and split (prefix just in
// front): a replica's holding of a node is always nearer the front than its
// holdings of the node's descendants. So the back of either list is always
// a holding whose node has no descendant held by the same replica (a leaf
// for that replica), and evicting from the back is leaf-first LRU.
type holding struct {
	node         *node
	rep          *replica
	gprev, gnext *holding // router-wide list
	rprev, rnext *holding // replica list
}

func (s *holding) initLists() { s.gprev, s.gnext, s.rprev, s.rnext = s, s, s, s }

// placeAfter moves h (linked or not) to just behind at in both lists.
// Passing the sentinels puts h at the front.
func placeAfter(atG, atR, h *holding) {
	if atG.gnext != h {
		if h.gnext != nil {
			h.gprev.gnext, h.gnext.gprev = h.gnext, h.gprev
		}
		h.gprev, h.gnext = atG, atG.gnext
		atG.gnext.gprev = h
		atG.gnext = h
	}
	if atR.rnext != h {
		if h.rnext != nil {
			h.rprev.rnext, h.rnext.rprev = h.rnext, h.rprev
		}
		h.rprev, h.rnext = atR, atR.rnext
		atR.rnext.rprev = h
		atR.rnext = h
	}
}

// unlink takes h out of both lists.
func unlink(h *holding) {
	h.gprev.gnext, h.gnext.gprev = h.gnext, h.gprev
	h.rprev.rnext, h.rnext.rprev = h.rnext, h.rprev
	h.gprev, h.gnext, h.rprev, h.rnext = nil, nil, nil, nil
}
