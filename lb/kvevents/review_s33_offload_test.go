package kvevents

import (
	"fmt"
	"testing"
)

// vLLM's CPU offloading connector (OffloadingConnector.take_events) puts
// BlockStored events without token ids in the same batch as the GPU's:
// token_ids [], parent nil, block_size 0 (newer) or the offload block size
// (older), medium "CPU". The index cannot key them, but the batch's other
// events are good: dropping the whole message left a sequence gap that
// cleared the replica's GPU entries at the next message.
func TestReviewS33OffloadStoredWithoutTokensKeepsTheBatch(t *testing.T) {
	prompt := seqTokens(0, 32)
	for _, bs := range []int{0, 16} {
		t.Run(fmt.Sprint(bs), func(t *testing.T) {
			cpu := []any{"BlockStored", anyHashes(7), nil, []any{}, bs, nil, "CPU", nil}
			payload := batchPayload(t, vllmStored(anyHashes(1, 2), nil, prompt, 16), cpu)
			m, err := DecodeMessage(frames(topicA, 1, payload), Limits{})
			if err != nil {
				t.Fatalf("block_size %d: a batch with an offloaded block: %v", bs, err)
			}
			ix := NewIndex(Config{})
			ix.Apply("a", m, t0)
			// the next message, no gap: the GPU blocks are still held
			ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, vllmRemoved(99))), t0)
			if got := match(ix, prompt, "a")[0]; got != 2 {
				t.Fatalf("block_size %d: match %d, want 2 (stats %+v)", bs, got, ix.Stats())
			}
			s := ix.Stats()
			if s.Gaps != 0 || len(s.Drops) != 0 || s.EventDrops[ReasonTokenCount] != 1 {
				t.Fatalf("block_size %d: gaps %d, drops %v, event drops %v; want 0, none, one token_count",
					bs, s.Gaps, s.Drops, s.EventDrops)
			}
			// the skipped event took none of the replica's source slots
			if n := len(ix.replicas["a"].sources); n != 1 {
				t.Fatalf("block_size %d: %d sources, want the GPU's alone", bs, n)
			}
		})
	}
}

// The same event in the named form.
func TestReviewS33OffloadStoredWithoutTokensNamed(t *testing.T) {
	cpu := map[string]any{"type": "BlockStored", "block_hashes": anyHashes(7), "parent_block_hash": nil,
		"token_ids": []any{}, "block_size": 0, "medium": "CPU"}
	b, err := DecodeBatch(pack(t, map[string]any{"ts": 1.0, "events": []any{cpu}}), Limits{})
	if err != nil {
		t.Fatalf("named offloaded block: %v", err)
	}
	if len(b.Events) != 1 || b.Events[0].Kind != BlockStored || len(b.Events[0].TokenIDs) != 0 || b.Events[0].Medium != "CPU" {
		t.Fatalf("events %+v", b.Events)
	}
}

// Stored events with token ids are checked as before: a block size out
// of range or a count that does not fill the blocks drops the message.
func TestReviewS33StoredWithTokensStillChecked(t *testing.T) {
	toks := seqTokens(0, 16)
	for _, c := range []struct {
		name string
		ev   []any
		want Reason
	}{
		{"block size 0 with tokens", []any{"BlockStored", anyHashes(1), nil, anyTokens(toks), 0}, ReasonBlockSize},
		{"block size negative with tokens", []any{"BlockStored", anyHashes(1), nil, anyTokens(toks), -16}, ReasonBlockSize},
		{"block size over int32", []any{"BlockStored", anyHashes(1), nil, anyTokens(toks), int64(1) << 40}, ReasonBlockSize},
		{"short tokens", []any{"BlockStored", anyHashes(1, 2), nil, anyTokens(toks), 16}, ReasonTokenCount},
	} {
		_, err := DecodeBatch(batchPayload(t, c.ev), Limits{})
		if ReasonOf(err) != c.want || err == nil {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
}
