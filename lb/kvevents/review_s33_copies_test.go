package kvevents

import "testing"

// vLLM does not de-duplicate cached blocks (BlockHashToBlockMap): two
// requests that fill the same prefix in one step each cache a block under
// the same hash, each with a BlockStored; each copy's eviction sends a
// BlockRemoved. The prefix stays cached while one copy is left.
func TestReviewS33DuplicateCopiesStayUntilTheLastRemoval(t *testing.T) {
	ix := NewIndex(Config{})
	p := seqTokens(0, 32)
	storeChain(t, ix, "a", topicA, 1, 1, nil, p, 16)                                 // request 1: blocks 1, 2
	storeChain(t, ix, "a", topicA, 2, 1, nil, p, 16)                                 // request 2, same step: its own copies
	ix.Apply("a", mustMessage(t, topicA, 3, batchPayload(t, vllmRemoved(2, 1))), t0) // one copy of each evicted
	if got := match(ix, p, "a")[0]; got != 2 {
		t.Fatalf("after one copy's removal: match %d, want 2 (the engine still holds the other copy)", got)
	}
	// a continuation names the kept block as its parent
	ix.Apply("a", mustMessage(t, topicA, 4, batchPayload(t, vllmStored(anyHashes(3), uint64(2), seqTokens(32, 16), 16))), t0)
	if got := match(ix, seqTokens(0, 48), "a")[0]; got != 3 {
		t.Fatalf("continuation: match %d, want 3 (stats %+v)", got, ix.Stats())
	}
	ix.Apply("a", mustMessage(t, topicA, 5, batchPayload(t, vllmRemoved(3, 2, 1))), t0)
	if s := ix.Stats(); s.Blocks != 0 || s.RemovedUnknown != 0 || match(ix, p, "a")[0] != 0 {
		t.Fatalf("after the last copies' removal: %+v", s)
	}
	checkIndex(t, ix, 0)
}
