package kvevents

import (
	"fmt"
	"testing"
)

// Stats.Events (sluice_kv_events_events_total) counts the events applied;
// an event the index drops (its parent unknown, one source too many) is
// counted under its drop reason in EventDrops only
// (sluice_kv_events_events_dropped_total), not as a message dropped.
func TestIndexEventsCountOnlyApplied(t *testing.T) {
	ix := NewIndex(Config{})
	stored := func(hash uint64, parent any, medium string) []any {
		return []any{"BlockStored", anyHashes(hash), parent, anyTokens(seqTokens(int(hash)*16, 16)), 16, nil, medium}
	}
	// applied, dropped (unknown parent), applied (a removal)
	ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t, stored(1, nil, "GPU"), stored(2, uint64(99), "GPU"), vllmRemoved(1))), t0)
	s := ix.Stats()
	if s.Events != 2 || s.EventDrops[ReasonParent] != 1 || len(s.Drops) != 0 {
		t.Fatalf("2 events applied and 1 dropped (unknown parent): events %d, event drops %v, message drops %v",
			s.Events, s.EventDrops, s.Drops)
	}
	// One source (rank, medium) per event, over the replica's bound.
	evs := make([]any, 0, maxSourcesPerReplica)
	for i := range maxSourcesPerReplica {
		evs = append(evs, stored(uint64(100+i), nil, fmt.Sprintf("M%d", i)))
	}
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, evs...)), t0)
	s = ix.Stats()
	// GPU and 63 more sources fit; the 64th new one and its sole event do not.
	if s.Events != 2+maxSourcesPerReplica-1 || s.EventDrops[ReasonTooMany] != 1 || len(s.Drops) != 0 {
		t.Fatalf("%d events applied and 1 dropped (too many sources): events %d, event drops %v, message drops %v",
			maxSourcesPerReplica-1, s.Events-2, s.EventDrops, s.Drops)
	}
}
