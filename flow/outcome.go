package flow

import "errors"

// Outcome is how a request left the controller; every request has exactly
// one. The names are the seed's QueueOutcome values (metric labels).
type Outcome uint8

const (
	// Dispatched: released to the proxy, directly or after waiting.
	Dispatched Outcome = iota + 1
	// RejectedCapacity: a global or band limit was met (429).
	RejectedCapacity
	// RejectedOther: the controller was shut down when it arrived (503 shutdown).
	RejectedOther
	// EvictedTTL: its TTL ran out in the queue (503).
	EvictedTTL
	// EvictedContextCancelled: its client went away while queued (503).
	EvictedContextCancelled
	// EvictedOther: the controller shut down while it was queued (503 shutdown).
	EvictedOther
)

func (o Outcome) String() string {
	switch o {
	case Dispatched:
		return "Dispatched"
	case RejectedCapacity:
		return "RejectedCapacity"
	case RejectedOther:
		return "RejectedOther"
	case EvictedTTL:
		return "EvictedTTL"
	case EvictedContextCancelled:
		return "EvictedContextCancelled"
	case EvictedOther:
		return "EvictedOther"
	}
	return "Unknown"
}

// Errors Enqueue returns; a cancelled request returns its ctx.Err().
var (
	// ErrCapacity: a global or per-band max_requests/max_bytes limit was
	// met. The adapter answers 429.
	ErrCapacity = errors.New("flow control: queue capacity exceeded")
	// ErrTTL: the request waited its whole TTL. The adapter answers 503.
	ErrTTL = errors.New("flow control: request expired in queue")
	// ErrShutdown: the controller is closed or closed while the request
	// waited. The adapter answers 503 shutdown, with Retry-After.
	ErrShutdown = errors.New("flow control: shutting down")
)

func (o Outcome) err() error {
	switch o {
	case RejectedCapacity:
		return ErrCapacity
	case EvictedTTL:
		return ErrTTL
	case RejectedOther, EvictedOther:
		return ErrShutdown
	}
	return nil
}
