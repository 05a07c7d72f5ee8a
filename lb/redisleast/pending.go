package redisleast

import (
	"sync"
	"time"
)

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

// putBack requeues a batch that could not be sent, within the bound;
// false on overflow (the caller rotates, as for add: the releases left
// out would otherwise count for as long as the identity lives).
func (p *pending) putBack(b pendingBatch) bool {
	for _, id := range b.ids {
		if !p.add(b.ident, id) {
			return false
		}
	}
	return true
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

// tombstones remembers the lost selects ("?id") this instance flushed:
// each may have left an empty-valued record (a tombstone, see
// releaseScript) in its instance hash, which nothing else removes while
// the instance lives. Once no late select can arrive any more (tombAge)
// the maintenance loop deletes the ones still empty, so an instance that
// lives through many Redis faults does not accumulate them.
type tombstones struct {
	mu  sync.Mutex
	max int
	ids map[*identity][]tomb
}

type tomb struct {
	id string
	at time.Time
}

// add records flushed lost-select ids (without their "?"); beyond the
// bound they are not tracked (each then stays in Redis, a few bytes,
// until the instance's hash goes).
func (t *tombstones) add(ident *identity, ids []string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, l := range t.ids {
		n += len(l)
	}
	for _, id := range ids {
		if n >= t.max {
			return
		}
		if t.ids == nil {
			t.ids = map[*identity][]tomb{}
		}
		t.ids[ident] = append(t.ids[ident], tomb{id, now})
		n++
	}
}

// takeOlder removes and returns the ids recorded before cutoff.
func (t *tombstones) takeOlder(cutoff time.Time) []pendingBatch {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []pendingBatch
	for ident, l := range t.ids {
		i := 0
		for i < len(l) && l[i].at.Before(cutoff) { // appended in time order
			i++
		}
		if i == 0 {
			continue
		}
		b := pendingBatch{ident: ident, ids: make([]string, i)}
		for j := range i {
			b.ids[j] = l[j].id
		}
		out = append(out, b)
		if i == len(l) {
			delete(t.ids, ident)
		} else {
			t.ids[ident] = l[i:]
		}
	}
	return out
}

// putBack re-records ids whose deletion failed, as old (tried again at
// the next round).
func (t *tombstones) putBack(b pendingBatch) { t.add(b.ident, b.ids, time.Time{}) }

func (t *tombstones) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, l := range t.ids {
		n += len(l)
	}
	return n
}
