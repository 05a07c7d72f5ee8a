package lb

import (
	"errors"
	"time"
)

// OutcomeKind says how one proxied attempt ended, as far as the balancer
// cares: only successes teach it latency; only failures count against the
// replica; a cancelled attempt (the client went away, or the response was
// cut off mid-stream) says nothing about the replica either way.
type OutcomeKind int

const (
	// Cancelled: the client gave up or the stream was cut; not the replica's fault.
	Cancelled OutcomeKind = iota
	// Success: a complete response below 500.
	Success
	// Failure: a transport error or a 5xx response.
	Failure
)

func (k OutcomeKind) String() string {
	switch k {
	case Success:
		return "success"
	case Failure:
		return "failure"
	default:
		return "cancelled"
	}
}

// Outcome is what a policy learns when an attempt it dispatched ends.
type Outcome struct {
	Kind OutcomeKind
	// Latency is the measured latency of a Success (see the policy's
	// latency_measure); zero otherwise.
	Latency time.Duration
	// Streamed: Latency is a streamed response's time to first byte, not
	// a time to last byte; the two are kept apart (not comparable).
	Streamed bool
	// Total is the time to last byte when known (also for a stream, whose
	// Latency is its first byte); zero when not.
	Total time.Duration
	// Status is the upstream's HTTP status, when one was received.
	Status int
}

// Errors a policy returns instead of a replica. The Caddy adapter maps each
// to a status, a machine-readable type and Retry-After.
var (
	ErrNoBackends   = errors.New("no backends in the pool")
	ErrQueueFull    = errors.New("queue is full")
	ErrEvicted      = errors.New("evicted from a full queue by a newer request")
	ErrQueueTimeout = errors.New("timed out waiting in the queue")
	ErrShutdown     = errors.New("policy is shutting down")
	ErrAllDown      = errors.New("every backend is down after failures")
	// ErrSaturated: every candidate is at its configured in-flight limit
	// and the policy does not queue (load shedding).
	ErrSaturated = errors.New("pool saturated: every candidate is at its in-flight limit")
)
