package streamrelay

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// take hands out as many waiting records as the count and byte bounds
// allow, not half of them: a take that shrank its bound by each record it
// took sent ceil(n/2) a batch (twice the round trips to drain the buffer).
func TestTakeTakesAllWithinBounds(t *testing.T) {
	b := newPublishBuffer(100, 1<<20)
	for range 10 {
		b.push(record{"x", "1"})
	}
	if got := b.take(256, 1<<20); len(got) != 10 {
		t.Errorf("took %d of 10 waiting records within bounds", len(got))
	}
	for range 10 {
		b.push(record{"x", "1"})
	}
	if got := b.take(4, 1<<20); len(got) != 4 {
		t.Errorf("took %d records, want the count bound 4", len(got))
	}
}

// A record that does not fit beside the batch in flight, even with every
// waiting record gone, is the one dropped: the waiting ones, which fit,
// are not dropped for it first.
func TestPushDropsOnlyTheRecordThatCannotFit(t *testing.T) {
	b := newPublishBuffer(100, 10)
	b.push(record{"aaaaa", "a"}) // 6 bytes
	if got := b.take(1, 10); len(got) != 1 {
		t.Fatalf("took %d records, want 1 in flight", len(got))
	}
	b.push(record{"b", "b"})               // 2 bytes waiting: 8 held
	dropped := b.push(record{"ccccc", ""}) // 5 bytes: 6 in flight + 5 > 10
	if n, held := b.pending(); dropped != 1 || n != 1 || held != 8 {
		t.Errorf("dropped %d, %d waiting, %d bytes held: want 1 dropped (the new one), 1 waiting, 8 bytes", dropped, n, held)
	}
}

// Random pushes, takes, settles and requeues keep the accounting: the
// bytes held are those waiting and in flight, within the bound, and every
// record pushed is exactly once waiting, in flight, sent or dropped.
func TestPublishBufferAccounting(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 50 {
		maxBytes := int64(1 + rng.IntN(64))
		b := newPublishBuffer(1+rng.IntN(8), maxBytes)
		var inFlight []record
		var pushed, sent, dropped uint64
		for op := range 200 {
			switch rng.IntN(4) {
			case 0, 1:
				size := rng.IntN(int(maxBytes) + 1)
				pushed++
				dropped += b.push(record{strings.Repeat("f", size), ""})
			case 2:
				if inFlight == nil {
					inFlight = b.take(1+rng.IntN(4), maxBytes/4)
				}
			case 3:
				k := rng.IntN(len(inFlight) + 1)
				b.settle(inFlight[:k])
				sent += uint64(k)
				dropped += b.requeue(inFlight[k:])
				inFlight = nil
			}
			var waiting, flying int64
			for i := range b.n {
				waiting += b.ring[(b.head+i)%len(b.ring)].size()
			}
			for _, rec := range inFlight {
				flying += rec.size()
			}
			n, held := b.pending()
			if held != waiting+flying || b.waiting != waiting || held > maxBytes ||
				pushed != uint64(n)+uint64(len(inFlight))+sent+dropped {
				t.Fatalf("run %d op %d: held %d (waiting %d, field %d, in flight %d), max %d; pushed %d = %d waiting + %d in flight + %d sent + %d dropped?",
					run, op, held, waiting, b.waiting, flying, maxBytes, pushed, n, len(inFlight), sent, dropped)
			}
		}
	}
}
