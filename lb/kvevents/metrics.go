package kvevents

import (
	"maps"
	"time"
)

// counters are the index's running totals, guarded by Index.mu.
type counters struct {
	batches, events, unknown uint64
	gaps, restarts, cleared  uint64
	removedUnknown           uint64
	capacityEvicted          uint64
	reStored                 uint64
	replays                  ReplayStats
	drops                    map[Reason]uint64 // whole messages
	eventDrops               map[Reason]uint64 // single events of an applied message
}

func newCounters() counters {
	return counters{drops: make(map[Reason]uint64), eventDrops: make(map[Reason]uint64)}
}

// drop counts a message dropped whole: none of its events applied.
func (c *counters) drop(r Reason) { c.drops[r]++ }

// dropEvent counts one event dropped from a message whose others applied.
// Apart from drop: a lost batch of 500 events and one lost event are not
// the same news.
func (c *counters) dropEvent(r Reason) { c.eventDrops[r]++ }

// Stats is a snapshot for metrics and health.
type Stats struct {
	Batches         uint64            // batches applied
	Events          uint64            // events applied (one the index dropped is in Drops only)
	UnknownEvents   uint64            // events with a tag this decoder does not know
	Gaps            uint64            // sequence gaps (the rank's entries cleared)
	Restarts        uint64            // sequence went back (the rank's entries cleared)
	Cleared         uint64            // AllBlocksCleared events
	RemovedUnknown  uint64            // BlockRemoved of a block the index did not hold
	CapacityEvicted uint64            // blocks dropped by MaxBlocksPerReplica/MaxBlocksTotal
	ReStored        uint64            // blocks stored again after their removal (keyed as before)
	Replays         ReplayStats       // gaps met with a replay socket, by outcome (replay.go)
	Drops           map[Reason]uint64 // messages dropped whole, by reason (none of their events in Events)
	EventDrops      map[Reason]uint64 // single events dropped from an applied message, by reason (not in Events)
	Blocks          int               // engine blocks held, all replicas
	Replicas        map[string]ReplicaStats
}

// ReplicaStats is one replica's part of Stats.
type ReplicaStats struct {
	Blocks    int       // engine blocks held
	Keys      int       // distinct Sluice keys held
	LastEvent time.Time // last batch applied
}

// Stats returns a snapshot of the counters and sizes.
func (ix *Index) Stats() Stats {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := Stats{
		Batches: ix.c.batches, Events: ix.c.events, UnknownEvents: ix.c.unknown,
		Gaps: ix.c.gaps, Restarts: ix.c.restarts, Cleared: ix.c.cleared,
		RemovedUnknown: ix.c.removedUnknown, CapacityEvicted: ix.c.capacityEvicted, ReStored: ix.c.reStored,
		Replays:    ix.c.replays,
		Drops:      maps.Clone(ix.c.drops),
		EventDrops: maps.Clone(ix.c.eventDrops),
		Blocks:     ix.total,
		Replicas:   make(map[string]ReplicaStats, len(ix.replicas)),
	}
	for name, r := range ix.replicas {
		s.Replicas[name] = ReplicaStats{Blocks: r.n, Keys: len(r.keys), LastEvent: r.lastEvent}
	}
	return s
}
