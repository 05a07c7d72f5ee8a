package qll

import "time"

// Snapshot is a consistent copy of the state, for health output and metrics.
type Snapshot struct {
	QueueDepth int               `json:"queue_depth"`
	OldestWait time.Duration     `json:"-"`
	Replicas   []ReplicaSnapshot `json:"backends"`
	Counters   Counters          `json:"-"`
	Draining   int               `json:"draining"`
}

// ReplicaSnapshot is one replica's statistics.
type ReplicaSnapshot struct {
	Addr        string  `json:"addr"`
	EWMASeconds float64 `json:"ewma_latency"` // of plain responses (last byte), else of streams
	// StreamEWMASeconds is the EWMA of streamed responses' first byte.
	StreamEWMASeconds float64 `json:"ewma_first_byte_stream"`
	Tried             bool    `json:"tried"`
	InFlight          int     `json:"in_flight"`
	// Parallelism is the replica's slots: pinned, or learned (Limit).
	Parallelism int     `json:"parallelism"`
	Limit       float64 `json:"concurrency_limit"`
	// SlotsFrom says what decides Parallelism: "engine" (the replica's
	// own metrics say it batches), "engine_probe" (they say it has room,
	// not yet whether it batches), "learned" or "pinned".
	SlotsFrom   string `json:"slots_from"`
	Down        bool   `json:"down"`
	ConsecFails int    `json:"consecutive_failures"`
	Dispatched  uint64 `json:"dispatched"`
	Successes   uint64 `json:"successes"`
	Failures    uint64 `json:"failures"`
	Present     bool   `json:"-"`
}

// Snapshot copies the state under its lock. Present replicas come first,
// in set order, then replicas removed but still draining.
func (s *State) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	snap := Snapshot{QueueDepth: s.queue.Len(), Counters: s.counters}
	if f := s.queue.Front(); f != nil {
		snap.OldestWait = now.Sub(f.Value.(*waiter).enqueued)
	}
	add := func(r *replica) {
		ewma := r.ewma[plainKind]
		if !r.tried[plainKind] {
			ewma = r.ewma[streamKind]
		}
		slots, from := s.slotsFromLocked(r, now)
		snap.Replicas = append(snap.Replicas, ReplicaSnapshot{
			Addr: r.addr, EWMASeconds: ewma, StreamEWMASeconds: r.ewma[streamKind],
			Tried: r.tried[plainKind] || r.tried[streamKind], InFlight: r.inFlight,
			Parallelism: slots, Limit: r.lim.limit, SlotsFrom: from,
			Down: now.Before(r.downUntil), ConsecFails: r.consecFails,
			Dispatched: r.dispatched, Successes: r.successes, Failures: r.failures,
			Present: r.present,
		})
	}
	for _, r := range s.order {
		add(r)
	}
	for _, r := range s.replicas {
		if !r.present {
			add(r)
			snap.Draining++
		}
	}
	return snap
}

// TotalInFlight is the total of in-flight requests over all replicas, including
// draining ones: zero once every lease has been released.
func (s *State) TotalInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.replicas {
		n += r.inFlight
	}
	return n
}
