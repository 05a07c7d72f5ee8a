package kvevents

import (
	"fmt"
	"testing"
	"time"
)

// The index tracks sequences per topic and rank, at most maxTopics of
// them. Replicas come and go (a pod replaced gets a new address, so new
// topics) and a topic that stopped publishing must not hold its slot
// forever: once the table is full of them, every new replica's events
// would be dropped (too_many) for the life of the process.
func TestIndexTopicsOfGoneReplicasMakeRoom(t *testing.T) {
	ix := NewIndex(Config{})
	payload := batchPayload(t, vllmStored(anyHashes(1), nil, seqTokens(0, 16), 16))
	for i := 0; i < maxTopics; i++ {
		pod := fmt.Sprintf("10.%d.%d.1:8000", i>>8, i&0xff)
		if !ix.Apply(pod, mustMessage(t, "kv@"+pod+"@m", 1, payload), t0) {
			t.Fatalf("topic %d refused", i)
		}
	}
	fresh := "10.200.0.1:8000"
	msg := mustMessage(t, "kv@"+fresh+"@m", 1, payload)
	if ix.Apply(fresh, msg, t0.Add(time.Second)) {
		t.Fatal("a new topic got in while every tracked one is active")
	}
	later := t0.Add(time.Hour) // the old replicas have been silent for an hour
	if !ix.Apply(fresh, msg, later) {
		t.Fatalf("a new replica's events are refused for good: %d topics, none active for an hour; drops %v",
			maxTopics, ix.Stats().Drops)
	}
	if got := ix.Match(ix.Keys(seqTokens(0, 16)), []string{fresh}); got[0] != 1 {
		t.Fatalf("new replica: %v", got)
	}
	// The topic that made room lost its sequence, so it lost its entries
	// too: what it held may be stale once it publishes again.
	s := ix.Stats()
	if s.Blocks != maxTopics {
		t.Fatalf("blocks %d, want %d (one topic's cleared, one added)", s.Blocks, maxTopics)
	}
}
