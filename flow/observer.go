package flow

import "time"

// Observer receives the measurements behind the seed's metrics. Enqueued
// and Finished are called on the request's goroutine without the
// controller's lock; DispatchCycle is called under it and must be quick.
type Observer interface {
	// Enqueued reports how long admission took and how it ended: "Queued",
	// or an Outcome's name when the request was dispatched or refused at
	// once.
	Enqueued(req *Request, outcome string, d time.Duration)
	// Finished reports a request's outcome and its time in the queue.
	Finished(req *Request, o Outcome, waited time.Duration)
	// DispatchCycle reports one run of the dispatch loop over non-empty
	// queues.
	DispatchCycle(d time.Duration)
}

type nopObserver struct{}

func (nopObserver) Enqueued(*Request, string, time.Duration)  {}
func (nopObserver) Finished(*Request, Outcome, time.Duration) {}
func (nopObserver) DispatchCycle(time.Duration)               {}
