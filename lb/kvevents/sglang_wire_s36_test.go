package kvevents

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// SGLang's KV events as its publisher puts them on the wire, derived from
// its msgspec definitions (python/sglang/srt/disaggregation/kv_events.py,
// the versions stored at 612d5790 and later; test pinning the shape:
// test/registered/unit/disaggregation/test_kv_events.py,
// TestBlockStoredWireFormat):
//
//	EventBatch(array_like) = [ts, events, attn_dp_rank]
//	BlockStored(array_like, tag) = ["BlockStored", block_hashes,
//	    parent_block_hash, token_ids, block_size, lora_id, medium]
//	BlockStoredWithMetadata (since sglang#30827, SGLang 0.5.18: a node
//	    with a cache_salt) = the same 7 and, 8th, BlockStoredMetadata, a
//	    plain msgspec Struct (a map): {"cache_salt": str}; sglang#37482 adds
//	    "session_id" (omit_defaults: either may be absent), which takes no
//	    part in block hashing.
//
// The 8th slot is where vLLM's positional form has lora_name (a string).

// sglangSalted is msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[
// BlockStoredWithMetadata(block_hashes=[123, -5], parent_block_hash=None,
// token_ids=[1, 2], block_size=1, lora_id=None, medium="GPU",
// metadata=BlockStoredMetadata(cache_salt="tenant-a"))], attn_dp_rank=0)),
// written out byte by byte.
var sglangSalted = strings.Join([]string{
	"93",                 // EventBatch: array of 3
	"cb3ff8000000000000", // ts 1.5 (msgspec writes floats as float64)
	"91",                 // events: array of 1
	"98",                 // BlockStoredWithMetadata: array of 8
	"ab" + hex.EncodeToString([]byte("BlockStored")),
	"927bfb", // block_hashes [123, -5]
	"c0",     // parent_block_hash None
	"920102", // token_ids [1, 2]
	"01",     // block_size 1
	"c0",     // lora_id None
	"a3" + hex.EncodeToString([]byte("GPU")),
	"81", // metadata: map of 1
	"aa" + hex.EncodeToString([]byte("cache_salt")),
	"a8" + hex.EncodeToString([]byte("tenant-a")),
	"00", // attn_dp_rank 0
}, "")

func sglangFixture(t *testing.T) []byte {
	t.Helper()
	b, err := hex.DecodeString(sglangSalted)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sglangStored is SGLang's BlockStored: medium always present (its
// KVCacheEvent has no omit_defaults), lora_id None; meta, when not nil,
// is the BlockStoredWithMetadata's 8th field.
func sglangStored(hashes []any, parent any, tokens []uint32, bs int, meta map[string]any) []any {
	ev := []any{"BlockStored", hashes, parent, anyTokens(tokens), bs, nil, "GPU"}
	if meta != nil {
		ev = append(ev, meta)
	}
	return ev
}

// The byte-exact fixture decodes, and the test helpers encode the same
// shape to the same bytes (so the fixtures built with them below are the
// ones SGLang sends).
func TestS36SGLangSaltedFixtureDecodes(t *testing.T) {
	raw := sglangFixture(t)
	built := pack(t, []any{1.5, []any{[]any{"BlockStored", []any{123, -5}, nil, []any{1, 2}, 1, nil, "GPU",
		map[string]any{"cache_salt": "tenant-a"}}}, 0})
	if !bytes.Equal(built, raw) {
		t.Fatalf("helper encodes\n%x\nSGLang sends\n%x", built, raw)
	}
	b, err := DecodeBatch(raw, Limits{})
	if err != nil {
		t.Fatalf("SGLang's salted BlockStored: %v", err)
	}
	if len(b.Events) != 1 || b.DPRank != 0 || b.TS != 1.5 {
		t.Fatalf("batch %+v", b)
	}
	ev := b.Events[0]
	if ev.Kind != BlockStored || len(ev.BlockHashes) != 2 || ev.BlockHashes[1] != IntHash(^uint64(4)) ||
		ev.BlockSize != 1 || len(ev.TokenIDs) != 2 || ev.Medium != "GPU" || ev.LoraName != "" || ev.HasLora {
		t.Fatalf("event %+v", ev)
	}
}

// A salted SGLang chain is keyed under its salt, as vLLM's (the salt in
// the first block's extra_keys) is: only a request of that salt matches
// it, also through an event that continues the chain (SGLang puts the
// metadata on every event of a salted node).
func TestS36SGLangSaltKeysLikeVLLM(t *testing.T) {
	prompt := seqTokens(9000, 48)
	salt := map[string]any{"cache_salt": "tenant-a"}
	ix := NewIndex(Config{})
	ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
		sglangStored(anyHashes(11, 12), nil, prompt[:32], 16, salt),
		sglangStored(anyHashes(13), 12, prompt[32:], 16, salt))), t0)
	s := ix.Stats()
	if s.Drops[ReasonMalformed] != 0 || s.Replicas["a"].Keys != 3 {
		t.Fatalf("salted SGLang events: drops %v, keys %d, want 3 keys", s.Drops, s.Replicas["a"].Keys)
	}
	if n := ix.Match(ix.KeysFor("m", "tenant-a", prompt), []string{"a"})[0]; n != 3 {
		t.Fatalf("a request salted tenant-a matches %d blocks, want 3", n)
	}
	for _, other := range []string{"", "tenant-b"} {
		if n := ix.Match(ix.KeysFor("m", other, prompt), []string{"a"})[0]; n != 0 {
			t.Fatalf("a request salted %q matches %d blocks of tenant-a's, want 0", other, n)
		}
	}

	// the same blocks from vLLM (salt in the first block's extra_keys)
	// give the same keys
	iv := NewIndex(Config{})
	iv.Apply("a", mustMessage(t, topicA, 1, namedBatch(t,
		vllmNamedStored(anyHashes(11, 12), nil, prompt[:32], 16, nil, nil, []any{[]any{"tenant-a"}, nil}),
		vllmNamedStored(anyHashes(13), 12, prompt[32:], 16, nil, nil, nil))), t0)
	if n := iv.Match(ix.KeysFor("m", "tenant-a", prompt), []string{"a"})[0]; n != 3 {
		t.Fatalf("vLLM's salted blocks match %d of SGLang's keys, want 3", n)
	}
}

// One salted event must not cost the batch: its unsalted neighbours apply.
func TestS36SGLangSaltedEventKeepsItsBatch(t *testing.T) {
	plain, salted := seqTokens(100, 16), seqTokens(200, 16)
	ix := NewIndex(Config{})
	ok := ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
		sglangStored(anyHashes(1), nil, plain, 16, nil),
		sglangStored(anyHashes(2), nil, salted, 16, map[string]any{"cache_salt": "s"}),
		[]any{"BlockRemoved", anyHashes(1), "GPU"})), t0)
	if !ok {
		t.Fatal("the batch was not applied")
	}
	if n := ix.Match(ix.KeysFor("m", "s", salted), []string{"a"})[0]; n != 1 {
		t.Fatalf("salted block: %d matched, want 1", n)
	}
	if n := ix.Match(ix.KeysFor("m", "", plain), []string{"a"})[0]; n != 0 {
		t.Fatalf("removed block still matches (%d): the remove was lost", n)
	}
}

// sglang#37482: metadata may carry a session_id, with or without a
// cache_salt; it is not part of a block's identity.
func TestS36SGLangSessionMetadata(t *testing.T) {
	prompt := seqTokens(3000, 16)
	for _, c := range []struct {
		meta map[string]any
		salt string
	}{
		{map[string]any{"session_id": "sess-1"}, ""},
		{map[string]any{"cache_salt": "t", "session_id": "sess-1"}, "t"},
		{map[string]any{"session_id": "sess-1", "cache_salt": "t"}, "t"},
		{map[string]any{}, ""},
	} {
		ix := NewIndex(Config{})
		if !ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
			sglangStored(anyHashes(7), nil, prompt, 16, c.meta))), t0) {
			t.Fatalf("%v: not applied", c.meta)
		}
		if n := ix.Match(ix.KeysFor("m", c.salt, prompt), []string{"a"})[0]; n != 1 {
			t.Fatalf("%v: salt %q matches %d, want 1", c.meta, c.salt, n)
		}
		if c.salt != "" {
			if n := ix.Match(ix.KeysFor("m", "", prompt), []string{"a"})[0]; n != 0 {
				t.Fatalf("%v: an unsalted request matches", c.meta)
			}
		}
	}
}

// Metadata Sluice cannot read as a salt keeps the message (its other
// events apply) but keys none of the event's blocks.
func TestS36SGLangOddMetadataHeldWithoutKeys(t *testing.T) {
	prompt := seqTokens(4000, 16)
	for _, meta := range []map[string]any{
		{"cache_salt": 5},
		{"cache_salt": []any{"x"}},
		{"cache_salt": strings.Repeat("s", 300)},
		{"cache_salt": ""},
	} {
		ix := NewIndex(Config{})
		if !ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
			sglangStored(anyHashes(7), nil, prompt, 16, meta),
			sglangStored(anyHashes(8), nil, seqTokens(5000, 16), 16, nil))), t0) {
			t.Fatalf("%v: not applied", meta)
		}
		s := ix.Stats()
		if s.Replicas["a"].Keys != 1 || s.EventDrops[ReasonExtraKeys] != 1 {
			t.Fatalf("%v: keys %d (want 1: the plain event's), drops %v", meta, s.Replicas["a"].Keys, s.EventDrops)
		}
	}
	// nil cache_salt: no salt
	ix := NewIndex(Config{})
	ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
		sglangStored(anyHashes(7), nil, prompt, 16, map[string]any{"cache_salt": nil}))), t0)
	if n := ix.Match(ix.KeysFor("m", "", prompt), []string{"a"})[0]; n != 1 {
		t.Fatalf("cache_salt None: %d matched unsalted, want 1", n)
	}
	// a nest too deep is malformed, not a stack overflow
	deep := any("x")
	for i := 0; i < 100; i++ {
		deep = []any{deep}
	}
	if _, err := DecodeBatch(batchPayload(t, sglangStored(anyHashes(7), nil, prompt, 16,
		map[string]any{"session_id": deep})), Limits{}); ReasonOf(err) != ReasonMalformed {
		t.Fatalf("deep metadata: %v", err)
	}
}

// SGLang with a bigram (EAGLE) radix key puts each position's token pair
// in token_ids (python/sglang/srt/mem_cache/events.py at cc6971b7: "bigram
// pages expose tuples"); block_size is the pairs' count. The position's
// own token is the pair's first.
func TestS36SGLangBigramTokens(t *testing.T) {
	prompt := seqTokens(6000, 33)
	pairs := make([]any, 32)
	for i := range pairs {
		pairs[i] = []any{prompt[i], prompt[i+1]}
	}
	ix := NewIndex(Config{})
	if !ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
		[]any{"BlockStored", anyHashes(1, 2), nil, pairs, 16, nil, "GPU"})), t0) {
		t.Fatal("not applied")
	}
	if n := ix.Match(ix.KeysFor("m", "", prompt[:32]), []string{"a"})[0]; n != 2 {
		t.Fatalf("bigram blocks: %d matched, want 2", n)
	}
	// a pair that is not two token ids, or a mix, is malformed
	for _, bad := range [][]any{
		{[]any{1}},
		{[]any{1, 2, 3}},
		{[]any{1, 2}, 3},
		{3, []any{1, 2}},
		{[]any{1, -2}},
	} {
		_, err := DecodeBatch(batchPayload(t, []any{"BlockStored", anyHashes(1), nil, bad, len(bad), nil, "GPU"}), Limits{})
		if ReasonOf(err) != ReasonMalformed {
			t.Fatalf("token ids %v: %v, want malformed", bad, err)
		}
	}
}
