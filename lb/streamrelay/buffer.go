package streamrelay

import "sync"

// record is a flat field, value, field, value... list.
type record []string

// size is what a record counts against the byte bounds: its fields' and
// values' bytes.
func (rec record) size() int64 {
	var n int64
	for _, s := range rec {
		n += int64(len(s))
	}
	return n
}

// publishBuffer holds the records waiting to be published, bounded in
// count and in bytes. The bytes of a batch taken out to be sent still
// count until it is settled (sent, or dropped) or put back, so what is
// waiting and what is in flight together stay within maxBytes. Past a
// bound the oldest waiting records go: the newest say most about the
// state now (a replica's cache, an engine's blocks), and it is the
// buffer's count bound's rule too.
type publishBuffer struct {
	mu       sync.Mutex
	ring     []record
	head, n  int
	held     int64 // bytes waiting and in flight
	waiting  int64 // bytes waiting
	maxBytes int64
}

func newPublishBuffer(maxRecords int, maxBytes int64) *publishBuffer {
	return &publishBuffer{ring: make([]record, maxRecords), maxBytes: maxBytes}
}

// push queues rec and returns how many records it dropped to keep the
// bounds: older waiting ones, or rec itself when only records in flight
// are left to make room.
func (b *publishBuffer) push(rec record) (dropped uint64) {
	size := rec.size()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held-b.waiting+size > b.maxBytes {
		// No room beside the batch in flight even with nothing waiting:
		// rec goes, not the waiting records that fit.
		return 1
	}
	for b.n > 0 && (b.n == len(b.ring) || b.held+size > b.maxBytes) {
		s := b.ring[b.head].size()
		b.held -= s
		b.waiting -= s
		b.ring[b.head] = nil
		b.head = (b.head + 1) % len(b.ring)
		b.n--
		dropped++
	}
	b.ring[(b.head+b.n)%len(b.ring)] = rec
	b.n++
	b.held += size
	b.waiting += size
	return dropped
}

// take takes the oldest records out to be sent: at most maxRecords, and
// at most maxBytes of them unless the first alone is more.
func (b *publishBuffer) take(maxRecords int, maxBytes int64) []record {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []record
	var bytes int64
	for b.n > 0 && len(out) < maxRecords {
		rec := b.ring[b.head]
		s := rec.size()
		if bytes += s; len(out) > 0 && bytes > maxBytes {
			break
		}
		b.waiting -= s
		out = append(out, rec)
		b.ring[b.head] = nil
		b.head = (b.head + 1) % len(b.ring)
		b.n--
	}
	return out
}

// settle releases the bytes of records taken out and now sent or
// dropped.
func (b *publishBuffer) settle(rs []record) {
	var bytes int64
	for _, rec := range rs {
		bytes += rec.size()
	}
	b.mu.Lock()
	b.held -= bytes
	b.mu.Unlock()
}

// requeue puts back records taken out that failed, ahead of newer ones,
// as far as the count bound has room (their bytes are still held), and
// returns how many it dropped: the oldest.
func (b *publishBuffer) requeue(rs []record) (dropped uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(rs) - 1; i >= 0; i-- {
		if b.n == len(b.ring) {
			for _, rec := range rs[:i+1] {
				b.held -= rec.size()
			}
			return uint64(i + 1)
		}
		b.head = (b.head - 1 + len(b.ring)) % len(b.ring)
		b.ring[b.head] = rs[i]
		b.n++
		b.waiting += rs[i].size()
	}
	return 0
}

// pending is the count of records waiting and the bytes held (waiting
// and in flight).
func (b *publishBuffer) pending() (records int, bytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n, b.held
}
