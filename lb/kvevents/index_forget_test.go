package kvevents

import (
	"testing"
	"time"
)

// A replica forgotten (it left the pool) and back later starts afresh:
// what its engine published meanwhile was not for this index, so its next
// message is no gap (none counted, no replay asked of the engine).
func TestIndexForgottenReplicaStartsAfresh(t *testing.T) {
	ix := NewIndex(Config{})
	storeChain(t, ix, "a", topicA, 1, 1, nil, seqTokens(0, 32), 16)
	ix.Forget("a")
	storeChain(t, ix, "a", topicA, 9, 100, nil, seqTokens(100, 32), 16)
	s := ix.Stats()
	if s.Gaps != 0 || s.Restarts != 0 {
		t.Fatalf("a forgotten replica's return counted as a lost sequence: %+v", s)
	}
	if s.Replicas["a"].Blocks != 2 {
		t.Fatalf("blocks after the return: %+v", s.Replicas["a"])
	}
	if _, seen := ix.lastSeq(seqKey{topic: topicA}); !seen {
		t.Fatal("the returning replica's sequence is not followed")
	}
}

// Retain forgets every replica that is not the pool's, speculative-only
// ones too, and keeps the others whole.
func TestIndexRetain(t *testing.T) {
	ix := NewIndex(Config{})
	storeChain(t, ix, "a", topicA, 1, 1, nil, seqTokens(0, 32), 16)
	storeChain(t, ix, "b", "kv@10.0.0.2:8000@m", 1, 1, nil, seqTokens(0, 48), 16)
	ix.Speculate("c", ix.Keys(seqTokens(0, 16)), t0, time.Minute)
	ix.Retain(func(name string) bool { return name == "b" })
	s := ix.Stats()
	if len(s.Replicas) != 1 || s.Replicas["b"].Blocks != 3 || s.Blocks != 3 {
		t.Fatalf("after Retain(b): %+v", s)
	}
	if _, seen := ix.lastSeq(seqKey{topic: topicA}); seen {
		t.Fatal("a forgotten replica's sequence is still followed")
	}
}

// The size bounds hold block by block, within a batch too: one batch (up
// to 16 MiB of blocks) never holds more than the bound, so it leaves what
// its events would leave sent one batch each.
func TestIndexBatchBoundedAsItsEvents(t *testing.T) {
	prompt := seqTokens(0, 96)
	events := []any{vllmStored(anyHashes(1, 2, 3, 4, 5, 6), nil, prompt, 16), vllmRemoved(5, 6)}
	one := NewIndex(Config{MaxBlocksPerReplica: 4})
	one.Apply("a", mustMessage(t, topicA, 1, batchPayload(t, events...)), t0)
	each := NewIndex(Config{MaxBlocksPerReplica: 4})
	for i, ev := range events {
		each.Apply("a", mustMessage(t, topicA, uint64(i+1), batchPayload(t, ev)), t0)
	}
	got, want := one.Stats(), each.Stats()
	if got.Replicas["a"].Blocks != want.Replicas["a"].Blocks || got.CapacityEvicted != want.CapacityEvicted {
		t.Fatalf("one batch left %d blocks (%d evicted), its events one batch each %d (%d evicted)",
			got.Replicas["a"].Blocks, got.CapacityEvicted, want.Replicas["a"].Blocks, want.CapacityEvicted)
	}
}
