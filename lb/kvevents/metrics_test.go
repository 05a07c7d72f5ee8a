package kvevents

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCollector(t *testing.T) {
	ix := NewIndex(Config{})
	storeChain(t, ix, "a", topicA, 1, 1, nil, seqTokens(0, 32), 16)
	storeChain(t, ix, "a", topicA, 3, 5, uint64(99), seqTokens(0, 16), 16) // a gap, then an unknown parent
	ix.CountDrop(ReasonMalformed)
	got := gather(t, ix)
	want := map[string]float64{
		"sluice_kv_events_batches_total":                       2,
		"sluice_kv_events_events_total":                        1, // the unknown parent's event is a drop
		"sluice_kv_events_gaps_total":                          1,
		"sluice_kv_events_restarts_total":                      0,
		"sluice_kv_events_dropped_total/malformed":             1,
		"sluice_kv_events_events_dropped_total/unknown_parent": 1,
		"sluice_kv_events_blocks/a":                            0,
		"sluice_kv_events_capacity_evicted_total":              0,
		"sluice_kv_events_last_event_timestamp_seconds/a":      float64(t0.Unix()),
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// gather scrapes a collector of ix (pool p1): name[/reason or replica] →
// value.
func gather(t *testing.T, ix *Index) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(func() map[string][]Source { return map[string][]Source{"p1": {{Index: ix}}} }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" || l.GetName() == "replica" {
					key += "/" + l.GetValue()
				}
			}
			if c := m.GetCounter(); c != nil {
				got[key] = c.GetValue()
			} else {
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	return got
}

// A whole message dropped (here a batch of 500 events over the limit) and
// one event dropped from a message otherwise applied (a source over the
// replica's bound) are counted apart: both were too_many in
// sluice_kv_events_dropped_total, so a lost batch read as one lost event.
func TestCollectorTellsDroppedMessagesFromDroppedEvents(t *testing.T) {
	ix := NewIndex(Config{})
	removals := make([]any, 500)
	for i := range removals {
		removals[i] = vllmRemoved(uint64(i + 1))
	}
	// What the listener does with a message DecodeMessage refuses.
	_, err := DecodeMessage(frames(topicA, 1, batchPayload(t, removals...)), Limits{MaxEventsPerBatch: 100})
	if ReasonOf(err) != ReasonTooMany {
		t.Fatalf("500 events over a limit of 100: want too_many, got %v", err)
	}
	ix.CountDrop(ReasonOf(err))
	// One source (rank, medium) per event: the last is over the bound.
	evs := make([]any, 0, maxSourcesPerReplica+1)
	for i := range maxSourcesPerReplica + 1 {
		evs = append(evs, []any{"BlockStored", anyHashes(uint64(100 + i)), nil, anyTokens(seqTokens(i*16, 16)), 16, nil, fmt.Sprintf("M%d", i)})
	}
	if !ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, evs...)), t0) {
		t.Fatal("the message with one source too many was dropped whole")
	}
	got := gather(t, ix)
	for k, v := range map[string]float64{
		"sluice_kv_events_batches_total":                 1,
		"sluice_kv_events_events_total":                  maxSourcesPerReplica,
		"sluice_kv_events_dropped_total/too_many":        1, // the message of 500
		"sluice_kv_events_events_dropped_total/too_many": 1, // the one event
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}
