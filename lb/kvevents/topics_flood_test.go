package kvevents

import (
	"testing"
	"time"
)

// One publisher must not take every topic slot: the table of sequences
// (topic, data-parallel rank) is shared by all replicas, and one topic
// cycling through ranks (up to 65,535 are accepted) filled it alone, so
// that every replica that came later (a pod replaced at a new address)
// had its events dropped (too_many) for as long as it kept publishing. A
// replica's own topics are bounded as its caches are (maxSourcesPerReplica);
// beyond, its own oldest one makes room.
func TestIndexOnePublisherCannotTakeEveryTopic(t *testing.T) {
	ix := NewIndex(Config{})
	const evil = "10.0.0.66:8000"
	now := t0
	for rank := 0; rank < maxTopics; rank++ {
		payload := pack(t, []any{1.0, []any{vllmStored(anyHashes(1), nil, seqTokens(0, 16), 16)}, rank})
		ix.Apply(evil, mustMessage(t, "kv@"+evil+"@m", 1, payload), now)
		now = now.Add(time.Millisecond)
	}
	const fresh = "10.0.0.2:8000"
	if !ix.Apply(fresh, mustMessage(t, "kv@"+fresh+"@m", 1, batchPayload(t, vllmStored(anyHashes(1), nil, seqTokens(0, 16), 16))), now) {
		t.Fatalf("a new replica's first message was refused after one publisher sent %d ranks: %d topics tracked, drops %v",
			maxTopics, len(ix.seqs), ix.Stats().Drops)
	}
	if got := ix.Match(ix.Keys(seqTokens(0, 16)), []string{fresh}); got[0] != 1 {
		t.Fatalf("new replica: %v", got)
	}
	if n := len(ix.seqs); n > maxSourcesPerReplica+1 {
		t.Fatalf("%d topics tracked, want at most %d of the flooding replica's and the new one", n, maxSourcesPerReplica)
	}
}
