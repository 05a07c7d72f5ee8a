package kvevents

import (
	"testing"
)

// vLLM runs a hybrid model (full attention with sliding-window or mamba
// layers) with one KV-cache group per layer kind and publishes each
// group's blocks under the same engine hashes (its block hash does not mix
// in the group), tagged with group_idx and, from vLLM 0.26 on, the group's
// kv_cache_spec_kind. As vllm/distributed/kv_events.py and a vLLM 0.26
// engine put them on the wire (msgspec tag=True, a map per event):
func groupStored(hashes []any, parent any, tokens []uint32, bs int, group any, kind any) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
		"token_ids": anyTokens(tokens), "block_size": bs, "lora_id": nil, "medium": "GPU",
		"lora_name": nil, "extra_keys": nil, "group_idx": group, "kv_cache_spec_kind": kind}
}

// BlockRemoved carries group_idx only (vLLM: "Remove events only need
// group_idx+hash").
func groupRemoved(group any, hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockRemoved", "block_hashes": anyHashes(hashes...), "medium": "GPU", "group_idx": group}
}

// vLLM's engine reuses a prefix only as far as its full-attention group
// holds it (kv_cache_coordinator.py: full attention is searched first and
// bounds the hit). The sliding-window group's copy of the same hashes
// must not keep a prefix the full-attention group evicted, nor make one
// it never stored.
func TestReviewS35GroupsFullAttentionDecides(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(900, 64) // 4 blocks
	ix.Apply("a", mustMessage(t, topicA, 1, namedBatch(t,
		groupStored(anyHashes(1, 2, 3, 4), nil, prompt, 16, 0, "full_attention"),
		groupStored(anyHashes(1, 2, 3, 4), nil, prompt, 16, 1, "sliding_window"))), t0)
	if got := match(ix, prompt, "a"); got[0] != 4 {
		t.Fatalf("both groups hold the prompt: matched %d blocks, want 4", got[0])
	}
	// the full-attention group evicts the last two blocks; the sliding
	// window group still holds them
	ix.Apply("a", mustMessage(t, topicA, 2, namedBatch(t, groupRemoved(0, 3, 4))), t0)
	if got := match(ix, prompt, "a"); got[0] != 2 {
		t.Fatalf("the full-attention group evicted blocks 3 and 4: matched %d blocks, want 2 (the engine cannot reuse a prefix its full-attention group lost)", got[0])
	}

	// b: only the sliding-window group holds the whole prompt
	ix.Apply("b", mustMessage(t, "kv@10.0.0.2:8000@m", 1, namedBatch(t,
		groupStored(anyHashes(11, 12), nil, prompt[:32], 16, 0, "full_attention"),
		groupStored(anyHashes(11, 12, 13, 14), nil, prompt, 16, 1, "sliding_window"))), t0)
	if got := match(ix, prompt, "b"); got[0] != 2 {
		t.Fatalf("b's full-attention group holds 2 blocks, its sliding-window group 4: matched %d, want 2", got[0])
	}
	if s := ix.Stats(); s.EventDrops[ReasonGroup] == 0 {
		t.Fatalf("the sliding-window group's events are not counted: event drops %v", s.EventDrops)
	}
}

// A sliding-window or mamba group caches only some of the blocks its token
// ids span (vLLM's block_pool.cache_full_blocks skips null blocks, while
// token_ids covers the whole range): fewer hashes than blocks. Such an
// event is the engine's normal output, not a malformed message: the other
// events of its batch (the full-attention group's) apply, and the next
// message is no sequence gap.
func TestReviewS35SparseGroupStoreKeepsTheBatch(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(300, 64)
	m, err := DecodeMessage(frames(topicA, 1, namedBatch(t,
		groupStored(anyHashes(1, 2, 3, 4), nil, prompt, 16, 0, "full_attention"),
		// mamba in align mode: one state block for the four
		groupStored(anyHashes(4), nil, prompt, 16, 1, "mamba"))), Limits{})
	if err != nil {
		t.Fatalf("a batch with a mamba group's store was dropped whole: %v", err)
	}
	ix.Apply("a", m, t0)
	ix.Apply("a", mustMessage(t, topicA, 2, namedBatch(t,
		groupStored(anyHashes(5), 4, seqTokens(364, 16), 16, 0, "full_attention"))), t0)
	long := append(append([]uint32(nil), prompt...), seqTokens(364, 16)...)
	if got := match(ix, long, "a"); got[0] != 5 {
		t.Fatalf("matched %d blocks, want 5", got[0])
	}
	// The same event with no group (an older vLLM serving a sliding-window
	// or mamba model alone): applied, the event counted, not keyed.
	m, err = DecodeMessage(frames(topicA, 3, batchPayload(t,
		vllmStored(anyHashes(9), 5, seqTokens(380, 32), 16))), Limits{})
	if err != nil {
		t.Fatalf("a store of fewer blocks than its token ids span dropped the message: %v", err)
	}
	ix.Apply("a", m, t0)
	if s := ix.Stats(); s.Gaps != 0 || s.EventDrops[ReasonSparse] != 1 || s.EventDrops[ReasonGroup] != 1 {
		t.Fatalf("gaps %d, event drops %v: want no gap, one sparse and one group drop", s.Gaps, s.EventDrops)
	}
	// more hashes than the token ids span is still malformed
	if _, err := DecodeMessage(frames(topicA, 4, batchPayload(t,
		vllmStored(anyHashes(1, 2, 3), nil, seqTokens(0, 32), 16))), Limits{}); ReasonOf(err) != ReasonTokenCount {
		t.Fatalf("3 hashes for 2 blocks of token ids: %v, want a token_count drop", err)
	}
}

// Before vLLM named a group's kind (group_idx alone), group 0 is taken for
// the full-attention group and the others are not keyed (as NVIDIA
// Dynamo's kv-router does); once a store names a group's kind, removals
// of that group (which carry group_idx only) follow it.
func TestReviewS35GroupKindLearned(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(1300, 48)
	ix.Apply("a", mustMessage(t, topicA, 1, namedBatch(t,
		groupStored(anyHashes(1, 2, 3), nil, prompt, 16, 0, nil),
		groupStored(anyHashes(1, 2, 3), nil, prompt, 16, 1, nil))), t0)
	ix.Apply("a", mustMessage(t, topicA, 2, namedBatch(t, groupRemoved(0, 3))), t0)
	if got := match(ix, prompt, "a"); got[0] != 2 {
		t.Fatalf("group 0 removed block 3: matched %d, want 2", got[0])
	}

	// group 2 is named full attention, group 0 sliding window: 2 decides
	ix2 := NewIndex(Config{})
	ix2.Apply("a", mustMessage(t, topicA, 1, namedBatch(t,
		groupStored(anyHashes(1, 2, 3), nil, prompt, 16, 0, "sliding_window"),
		groupStored(anyHashes(1, 2, 3), nil, prompt, 16, 2, "full_attention"))), t0)
	ix2.Apply("a", mustMessage(t, topicA, 2, namedBatch(t, groupRemoved(0, 1, 2, 3))), t0)
	if got := match(ix2, prompt, "a"); got[0] != 3 {
		t.Fatalf("the sliding-window group 0 removed its copies: matched %d, want 3 (group 2 holds them)", got[0])
	}
	ix2.Apply("a", mustMessage(t, topicA, 3, namedBatch(t, groupRemoved(2, 2))), t0)
	if got := match(ix2, prompt, "a"); got[0] != 1 {
		t.Fatalf("the full-attention group 2 removed block 2: matched %d, want 1", got[0])
	}
}

// Of several full-attention groups the lowest is keyed (vLLM frees a
// request's groups in order, so it loses its blocks first); one seen
// after a higher one replaces it, and a group said to be of another kind
// since is keyed no more.
func TestReviewS35GroupPrimarySwitch(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(2100, 48)
	ix.Apply("a", mustMessage(t, topicA, 1, namedBatch(t,
		groupStored(anyHashes(1, 2, 3), nil, prompt, 16, 2, "full_attention"))), t0)
	ix.Apply("a", mustMessage(t, topicA, 2, namedBatch(t,
		groupStored(anyHashes(1), nil, prompt[:16], 16, 1, "mla_attention"))), t0)
	if got := match(ix, prompt, "a"); got[0] != 1 {
		t.Fatalf("group 1 holds one block, group 2 three: matched %d, want 1 (group 1 keyed)", got[0])
	}
	ix.Apply("a", mustMessage(t, topicA, 3, namedBatch(t,
		groupStored(anyHashes(2), 1, prompt[16:32], 16, 2, "full_attention"))), t0)
	if got := match(ix, prompt, "a"); got[0] != 1 {
		t.Fatalf("a store of group 2 after group 1 took its place: matched %d, want 1", got[0])
	}
	ix.Apply("a", mustMessage(t, topicA, 4, namedBatch(t,
		groupStored(anyHashes(2), 1, prompt[16:32], 16, 1, "sliding_window"))), t0)
	if got := match(ix, prompt, "a"); got[0] != 0 {
		t.Fatalf("group 1 now says sliding_window: matched %d, want 0", got[0])
	}
}

// The positional form (msgspec array_like): group_idx after extra_keys
// in BlockStored, after medium in BlockRemoved.
func TestReviewS35GroupsPositional(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(70, 32)
	stored := func(hashes []any, group int, kind string) []any {
		return []any{"BlockStored", hashes, nil, anyTokens(prompt), 16, nil, "GPU", nil, nil, group, kind, nil}
	}
	ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
		stored(anyHashes(1, 2), 0, "full_attention"), stored(anyHashes(1, 2), 1, "sliding_window"))), t0)
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t,
		[]any{"BlockRemoved", anyHashes(1, 2), "GPU", 0})), t0)
	if got := match(ix, prompt, "a"); got[0] != 0 {
		t.Fatalf("the full-attention group removed both blocks: matched %d, want 0", got[0])
	}
}

// Hostile group fields: an index out of range keys nothing (counted), a
// kind of the wrong type drops the message, nothing panics.
func TestReviewS35GroupHostile(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(10, 16)
	for i, g := range []any{-1, maxGroupIdx + 1, int64(1) << 40} {
		m, err := DecodeMessage(frames(topicA, uint64(i+1), namedBatch(t,
			groupStored(anyHashes(uint64(i+1)), nil, prompt, 16, g, "full_attention"))), Limits{})
		if err != nil {
			if ReasonOf(err) != ReasonMalformed {
				t.Fatalf("group %v: %v", g, err)
			}
			continue
		}
		ix.Apply("a", m, t0)
	}
	if got := match(ix, prompt, "a"); got[0] != 0 {
		t.Fatalf("a group out of range keyed %d blocks", got[0])
	}
	if _, err := DecodeMessage(frames(topicA, 9, namedBatch(t,
		groupStored(anyHashes(1), nil, prompt, 16, 0, []any{"x"}))), Limits{}); ReasonOf(err) != ReasonMalformed {
		t.Fatalf("a kind that is a list: %v, want malformed", err)
	}
}
