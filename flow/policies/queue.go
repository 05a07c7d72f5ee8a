package policies

// Queue is one flow's requests, kept as a binary heap in the order of the
// band's OrderingPolicy: Head is the item the policy would serve first.
// Push, Pop and Remove are O(log n) and allocation-free once the backing
// slice has grown; Remove takes any queued item, which is how expiry and
// cancellation leave the queue at once.
type Queue struct {
	// ID is the flow's fairness id.
	ID string

	less  func(a, b *Item) bool
	items []*Item
}

// NewQueue returns an empty queue for flow id ordered by ord.
func NewQueue(id string, ord OrderingPolicy) *Queue {
	return &Queue{ID: id, less: ord.Less}
}

// Len is the number of queued items.
func (q *Queue) Len() int { return len(q.items) }

// Head is the item to serve next, nil when empty.
func (q *Queue) Head() *Item {
	if len(q.items) == 0 {
		return nil
	}
	return q.items[0]
}

// Push adds it. Pushing an item that is queued (here or elsewhere) is a
// bug and panics.
func (q *Queue) Push(it *Item) {
	if it.pos != 0 {
		panic("policies: item pushed while queued")
	}
	q.items = append(q.items, it)
	it.pos = len(q.items)
	q.up(it.pos - 1)
}

// Pop removes and returns the head, nil when empty.
func (q *Queue) Pop() *Item {
	h := q.Head()
	if h != nil {
		q.Remove(h)
	}
	return h
}

// Remove takes it out of the queue; false if it was not in this queue.
func (q *Queue) Remove(it *Item) bool {
	i := it.pos - 1
	if i < 0 || i >= len(q.items) || q.items[i] != it {
		return false
	}
	last := len(q.items) - 1
	if i != last {
		q.swap(i, last)
	}
	q.items[last] = nil // let the request be collected
	q.items = q.items[:last]
	it.pos = 0
	if i != last {
		if !q.down(i) {
			q.up(i)
		}
	}
	return true
}

// Each calls fn for every queued item, in no particular order.
func (q *Queue) Each(fn func(*Item)) {
	for _, it := range q.items {
		fn(it)
	}
}

func (q *Queue) swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.items[i].pos = i + 1
	q.items[j].pos = j + 1
}

func (q *Queue) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(q.items[i], q.items[p]) {
			return
		}
		q.swap(i, p)
		i = p
	}
}

// down sifts i towards the leaves; it reports whether i moved.
func (q *Queue) down(i int) bool {
	start, n := i, len(q.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.less(q.items[r], q.items[l]) {
			m = r
		}
		if !q.less(q.items[m], q.items[i]) {
			break
		}
		q.swap(i, m)
		i = m
	}
	return i > start
}
