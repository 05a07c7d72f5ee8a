package kvevents

import (
	"strings"
	"testing"
	"time"
)

// FuzzDecode feeds arbitrary payloads and frames to the decoder and what it
// accepts to an index: never a panic, and what is accepted keeps the limits.
// Plain `go test` runs the seed corpus; `go test -fuzz FuzzDecode` explores.
func FuzzDecode(f *testing.F) {
	toks := seqTokens(0, 32)
	f.Add("kv@127.0.0.1:9150@m", uint64(1), batchPayload(f,
		vllmStored(anyHashes(1, 2), nil, toks, 16), vllmRemoved(2), []any{"AllBlocksCleared"}))
	f.Add("kv@127.0.0.1:9150@m", uint64(2), pack(f, []any{1.0, []any{
		[]any{"BlockStored", anyHashes(3), 1, anyTokens(toks[:16]), 16}, []any{"BlockRemoved", anyHashes(1)}}}))
	f.Add("kv@h:1@m", uint64(0), pack(f, map[string]any{"ts": 1.0, "data_parallel_rank": 1, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{[]byte("abc")}, "parent_block_hash": nil,
			"token_ids": anyTokens(toks[:8]), "block_size": 8}}}))
	f.Add("kv@h:1@m", uint64(5), batchPayload(f, vllmStored(anyHashes(9), 0, toks[:4], 4)))
	// a hybrid model's groups (vLLM 0.26): full attention, a sparse mamba store, a removal
	f.Add("kv@h:1@m", uint64(6), pack(f, map[string]any{"ts": 1.0, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": anyHashes(1, 2), "parent_block_hash": nil,
			"token_ids": anyTokens(toks), "block_size": 16, "group_idx": 0, "kv_cache_spec_kind": "full_attention"},
		map[string]any{"type": "BlockStored", "block_hashes": anyHashes(2), "parent_block_hash": nil,
			"token_ids": anyTokens(toks), "block_size": 16, "group_idx": 1, "kv_cache_spec_kind": "mamba"},
		map[string]any{"type": "BlockRemoved", "block_hashes": anyHashes(2), "group_idx": 1}}}))
	f.Add("kv@h:1@m", uint64(7), batchPayload(f,
		[]any{"BlockStored", anyHashes(1), nil, anyTokens(toks[:16]), 16, 3, "GPU", nil, nil, 2, "sliding_window", 128},
		[]any{"BlockRemoved", anyHashes(1), "GPU", 2}))
	f.Add("bad", uint64(0), []byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add("kv@h:1@m", uint64(3), []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x7f, 0xff, 0xff, 0xff})
	lim := Limits{MaxEventsPerBatch: 64, MaxBlocksPerEvent: 64, MaxTokensPerEvent: 1024, MaxBlockSize: 64, MaxPayloadBytes: 1 << 16}
	f.Fuzz(func(t *testing.T, topic string, seq uint64, payload []byte) {
		m, err := DecodeMessage(frames(topic, seq, payload), lim)
		if err != nil {
			if ReasonOf(err) == "" {
				t.Fatalf("error without a reason: %v", err)
			}
			// DecodeBatch turns a panic into a malformed message, so the
			// proxy survives a decoder bug; the fuzzer must still see it.
			if strings.Contains(err.Error(), "decoder panic") {
				t.Fatalf("the decoder panicked: %v", err)
			}
			return
		}
		if len(m.Batch.Events) > lim.MaxEventsPerBatch {
			t.Fatalf("%d events over the limit", len(m.Batch.Events))
		}
		for _, ev := range m.Batch.Events {
			if len(ev.BlockHashes) > lim.MaxBlocksPerEvent {
				t.Fatalf("%d blocks over the limit", len(ev.BlockHashes))
			}
			if ev.Kind == BlockStored && len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
				t.Fatalf("token count %d for %d blocks of %d", len(ev.TokenIDs), len(ev.BlockHashes), ev.BlockSize)
			}
		}
		ix := NewIndex(Config{BlockSize: 4, MaxBlocksPerReplica: 16, MaxBlocksTotal: 24})
		ix.Apply(m.Pod, m, time.Unix(0, 0))
		ix.Apply("other", m, time.Unix(0, 0))
		if s := ix.Stats(); s.Blocks > 24 || s.Replicas[m.Pod].Blocks > 16 {
			t.Fatalf("bounds not kept: %+v", s)
		}
		ix.Match(ix.Keys(seqTokens(0, 32)), []string{m.Pod, "other"})
	})
}
