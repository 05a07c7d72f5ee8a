package flow

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/flow/policies"
)

// Request is what the controller needs to know about one request.
type Request struct {
	// FlowID is the fairness id (x-gateway-inference-fairness-id). Requests
	// without one share one flow per priority, as in the seed.
	FlowID string
	// Priority picks the band (see Objectives.Priority).
	Priority int
	// Bytes is the body size, counted against max_bytes while queued.
	Bytes int64
	// Tokens is the estimated token cost, counted by the concurrency
	// detector in tokens mode while in flight.
	Tokens int64
	// SLOTTFT is the time-to-first-token objective (x-slo-ttft-ms); 0 means
	// none. The slo_deadline ordering serves by arrival + SLOTTFT.
	SLOTTFT time.Duration
	// TTL, if positive, replaces the band's TTL for this request.
	TTL time.Duration
	// Model and TargetModel only label metrics (model_name, target_model_name).
	Model, TargetModel string
	// Queued, if set, is called once when the request is queued rather
	// than dispatched or refused at once: on Enqueue's goroutine, without
	// the controller's lock, before Enqueue waits for the outcome (which
	// may come while it runs). The adapter reads the body then: net/http
	// notices a client that went away only once the body has been read,
	// and until then a queued request's ctx never ends. left is done
	// once the request has left the queue without being dispatched
	// (pushed out, expired, closed), never if it was dispatched; a hook
	// that blocks (the body read waits on its client) must then return
	// promptly: Enqueue returns the refusal only once it has.
	Queued func(left context.Context)
}

// waiter is a queued request. Its fields after item are guarded by the
// controller's mutex; resolved turns true exactly once.
type waiter struct {
	item  policies.Item // item.Value points back to the waiter
	req   Request
	band  *band
	queue *policies.Queue
	timer Timer // TTL expiry, nil until armed
	done  chan struct{}
	leave context.CancelFunc // ends its Queued hook's context; nil without one

	resolved bool
	outcome  Outcome
	err      error
	ticket   *Ticket
}

// Ticket is a dispatched request's slot. The caller must Release it
// exactly once when the proxied request ends, whatever the ending
// (success, error, client gone, panic), so the in-flight counts stay exact.
type Ticket struct {
	c        *Controller
	tokens   int64
	flow     FlowKey
	released atomic.Bool
	// Waited is how long the request waited in the queue (0 when it passed
	// straight through).
	Waited time.Duration
}

// Release frees the slot and lets waiting requests in. It returns false
// (and does nothing) if the ticket was already released.
func (t *Ticket) Release() bool {
	if !t.released.CompareAndSwap(false, true) {
		return false
	}
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inFlight.Requests--
	c.inFlight.Tokens -= t.tokens
	c.countFlowLocked(t.flow, t.tokens, -1)
	c.counters.Released++
	c.dispatchLocked()
	c.publishLocked()
	return true
}
