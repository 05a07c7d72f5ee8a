package policies

import "container/list"

// roundRobin cycles through the backlogged flows one request at a time:
// the flow served goes to the back of the ring, a flow that becomes
// backlogged joins at the back. A tenant sending ten times more gets the
// same number of turns as the others, not ten times more.
type roundRobin struct {
	ring list.List // of *Queue, the flow whose turn it is in front
	at   map[*Queue]*list.Element
}

func newRoundRobin() *roundRobin { return &roundRobin{at: map[*Queue]*list.Element{}} }

func (*roundRobin) Name() string { return RoundRobin }

func (r *roundRobin) Next() *Queue {
	if f := r.ring.Front(); f != nil {
		return f.Value.(*Queue)
	}
	return nil
}

func (r *roundRobin) Update(q *Queue, served bool) {
	e, in := r.at[q]
	switch {
	case q.Len() == 0:
		if in {
			r.ring.Remove(e)
			delete(r.at, q)
		}
	case !in:
		r.at[q] = r.ring.PushBack(q)
	case served:
		r.ring.MoveToBack(e)
	}
}
