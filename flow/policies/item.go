package policies

import "time"

// Item is one queued request as the policies see it. The framework fills
// the exported fields before pushing and must not change them while the
// item is queued (the queue's order depends on them).
type Item struct {
	// Seq is the arrival order, unique per controller: the final tie-break
	// of every ordering, so orders are total and deterministic.
	Seq uint64
	// Arrival is when the request entered the controller.
	Arrival time.Time
	// Deadline is when the request expires from the queue (arrival + TTL).
	Deadline time.Time
	// SLODeadline is arrival + the request's TTFT objective; zero when the
	// request carries none.
	SLODeadline time.Time
	// Value is the framework's payload; policies never look at it.
	Value any

	pos int // 1 + position in its queue's heap; 0 when not queued, so the zero Item is unqueued
}

// Queued reports whether the item is in a queue.
func (it *Item) Queued() bool { return it.pos > 0 }
