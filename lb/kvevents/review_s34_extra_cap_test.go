package kvevents

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// extra_keys with more than 1024 entries whose first non-nil one comes
// after the 1024th: the decoder made its slice with a length over its
// capacity (a panic: "makeslice: cap out of range") on one hostile or
// merely long message.
func TestReviewS34ExtraKeysLateFirstEntry(t *testing.T) {
	const n = 1500
	hashes := make([]any, n)
	extra := make([]any, n)
	for i := range n {
		hashes[i] = uint64(i + 1)
	}
	extra[n-1] = []any{"salt"}
	tokens := make([]any, n)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	payload, err := msgpack.Marshal(map[string]any{"ts": 1.5, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
			"token_ids": tokens, "block_size": 1, "extra_keys": extra}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := DecodeBatch(payload, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ev := b.Events[0]
	if len(ev.Extra) != n || len(ev.Extra[n-1].Strings) != 1 || len(ev.Extra[0].Strings) != 0 {
		t.Fatalf("extra keys decoded as %d entries, last %+v", len(ev.Extra), ev.Extra[n-1])
	}
}
