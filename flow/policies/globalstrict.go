package policies

// globalStrict ignores flow isolation: it serves the band's requests in one
// global order, the band's ordering policy applied across all flows. It
// keeps the flows in a heap keyed by their heads, so the flow holding the
// globally first request is found in O(1) and kept in O(log flows).
type globalStrict struct {
	less  func(a, b *Item) bool
	heap  []*Queue
	index map[*Queue]int
}

func newGlobalStrict(o OrderingPolicy) *globalStrict {
	return &globalStrict{less: o.Less, index: map[*Queue]int{}}
}

func (*globalStrict) Name() string { return GlobalStrict }

func (g *globalStrict) Next() *Queue {
	if len(g.heap) == 0 {
		return nil
	}
	return g.heap[0]
}

// Update re-keys q: any change may have moved its head.
func (g *globalStrict) Update(q *Queue, _ bool) {
	i, in := g.index[q]
	switch {
	case q.Len() == 0:
		if in {
			g.remove(i)
		}
	case !in:
		g.heap = append(g.heap, q)
		g.index[q] = len(g.heap) - 1
		g.up(len(g.heap) - 1)
	default:
		if !g.down(i) {
			g.up(i)
		}
	}
}

func (g *globalStrict) before(i, j int) bool { return g.less(g.heap[i].Head(), g.heap[j].Head()) }

func (g *globalStrict) swap(i, j int) {
	g.heap[i], g.heap[j] = g.heap[j], g.heap[i]
	g.index[g.heap[i]] = i
	g.index[g.heap[j]] = j
}

func (g *globalStrict) remove(i int) {
	last := len(g.heap) - 1
	q := g.heap[i]
	if i != last {
		g.swap(i, last)
	}
	g.heap[last] = nil
	g.heap = g.heap[:last]
	delete(g.index, q)
	if i != last && !g.down(i) {
		g.up(i)
	}
}

func (g *globalStrict) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !g.before(i, p) {
			return
		}
		g.swap(i, p)
		i = p
	}
}

func (g *globalStrict) down(i int) bool {
	start, n := i, len(g.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && g.before(r, l) {
			m = r
		}
		if !g.before(m, i) {
			break
		}
		g.swap(i, m)
		i = m
	}
	return i > start
}
