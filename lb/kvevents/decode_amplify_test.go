package kvevents

import (
	"errors"
	"testing"
)

// A block hash costs a publisher one byte (a small int) and the decoder
// some 32 (its 9-byte string and the slice's header): a 16 MiB payload
// of BlockRemoved events, 1,000 of 16,384 hashes each, within every
// per-event limit, decoded to 515 MiB (1.4 GiB allocated), over and over
// from one publisher, and held as decoded while a replay runs. The hashes
// of one batch are bounded as a whole; a step's worth of real events (a
// 1M-token prompt stored at block size 16 and as many blocks removed)
// still decodes.
func TestDecodeBoundsTheBlocksOfABatch(t *testing.T) {
	// ["BlockRemoved", [16384 small ints, one byte each], nil]
	ev := append(pack(t, "BlockRemoved"), 0xdc, 0x40, 0x00)
	ev = append([]byte{0x93}, ev...)
	for i := 0; i < 16384; i++ {
		ev = append(ev, byte(i%100))
	}
	ev = append(ev, 0xc0)
	// [1.0, [ev × 1000], 0], the events array spelled out (array 32)
	payload := append(pack(t, 1.0), 0xdd, 0, 0, 0x03, 0xe8)
	payload = append([]byte{0x93}, payload...)
	for i := 0; i < 1000; i++ {
		payload = append(payload, ev...)
	}
	payload = append(payload, 0)
	if len(payload) > DefaultLimits().MaxPayloadBytes {
		t.Fatalf("payload of %d bytes is over the limit itself", len(payload))
	}
	_, err := DecodeBatch(payload, Limits{})
	var de *DecodeError
	if !errors.As(err, &de) || de.Reason != ReasonTooMany {
		t.Fatalf("16.4 million hashes in one %d MiB batch: want too_many, got %v", len(payload)>>20, err)
	}

	// A real step: a 1M-token prompt's 65,536 blocks stored (in four
	// events of the per-event limit) and 65,536 others removed.
	var events []any
	for i := 0; i < 4; i++ {
		stored := make([]uint64, 16384)
		removed := make([]uint64, 16384)
		for j := range stored {
			stored[j] = uint64(1 + i*16384 + j)
			removed[j] = uint64(1<<32 + i*16384 + j)
		}
		events = append(events, []any{"BlockStored", stored, nil, seqTokens(i*262144, 262144), 16, nil, "GPU"},
			[]any{"BlockRemoved", removed, "GPU"})
	}
	b, err := DecodeBatch(pack(t, []any{1.0, events, 0}), Limits{})
	if err != nil || len(b.Events) != 8 {
		t.Fatalf("a 1M-token step: %d events, %v", len(b.Events), err)
	}
}
