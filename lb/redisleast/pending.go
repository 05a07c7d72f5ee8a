package redisleast

import "sync"

// identity is the name under which an instance records its requests.
type identity struct {
	id, alive, inst string
}

// pending keeps the releases Redis could not take (the breaker was open or
// the call failed), and the selects whose outcome is unknown (a timeout
// may strike after the script ran): both are sent as releases once Redis
// answers again. Releasing is idempotent by request id, so an id that was
// never recorded, or was reclaimed meanwhile, changes nothing.
//
// The queue is bounded. On overflow the instance takes a new identity and
// forgets the queue: nothing renews the old liveness key any more, so the
// reapers reclaim everything recorded under it within LeaseTTL + reap
// interval of the outage's end. That trades exactness for the old
// identity's requests still in flight (undercounted until they end) for a
// bounded memory and no leak.
type pending struct {
	mu  sync.Mutex
	max int
	ids map[*identity][]string
}

type pendingBatch struct {
	ident *identity
	ids   []string
}

// add queues one release; false on overflow (the caller rotates).
func (p *pending) add(ident *identity, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, ids := range p.ids {
		n += len(ids)
	}
	if n >= p.max {
		return false
	}
	if p.ids == nil {
		p.ids = map[*identity][]string{}
	}
	p.ids[ident] = append(p.ids[ident], id)
	return true
}

// take removes and returns everything queued.
func (p *pending) take() []pendingBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]pendingBatch, 0, len(p.ids))
	for ident, ids := range p.ids {
		out = append(out, pendingBatch{ident, ids})
	}
	p.ids = nil
	return out
}

// putBack requeues a batch that could not be sent, within the bound.
func (p *pending) putBack(b pendingBatch) {
	for _, id := range b.ids {
		if !p.add(b.ident, id) {
			return
		}
	}
}

// clear drops everything (identity rotation).
func (p *pending) clear() {
	p.mu.Lock()
	p.ids = nil
	p.mu.Unlock()
}

func (p *pending) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, ids := range p.ids {
		n += len(ids)
	}
	return n
}

// setMax changes the bound (Configure); what is already queued stays.
func (p *pending) setMax(n int) {
	p.mu.Lock()
	p.max = n
	p.mu.Unlock()
}
