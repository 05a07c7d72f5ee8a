package flow

// SaturationDetector is the gate of flow control, and the whole contract
// between the controller and a detector: the controller asks, the
// detector answers. A detector never calls the controller; one that needs
// to know what the controller holds and queues (flow/redisgate, which
// shares the pool with other instances) reads the DemandFeed the
// controller publishes to. Implementations must be safe for concurrent
// use; the controller asks under its lock, so Saturation must be quick.
type SaturationDetector interface {
	// Saturation answers for the pool now. inFlight is what this
	// controller has dispatched and not yet had released.
	Saturation(inFlight InFlight) Verdict
}

// Verdict is a detector's answer. Only Load is required; the zero value
// of every other field means "nothing to add".
type Verdict struct {
	// Load is the pool's load as a fraction of its capacity: 0 is idle,
	// 1 or more is saturated (nothing is dispatched).
	Load float64
	// Capacity is how many requests the pool serves at once, 0 if
	// unknown. A band without max_requests sizes its queue from it (see
	// BandQueueLimit); unknown, from what is in flight when the queue
	// forms.
	Capacity int64
	// QueueShare is this instance's part of the pool's queues, in (0, 1]
	// (0 reads as 1): N instances sharing a pool each queue about 1/N of
	// what one flow control in front of it would.
	QueueShare float64
	// Shares, when set, is how much of the pool each flow may use at
	// this instance: dispatch serves first the backlogged flow furthest
	// below its share, then the band's fairness policy.
	Shares *FlowShares
	// Recheck, when set, becomes ready when the answer may have changed
	// without an event the controller sees (capacity freed at another
	// instance): the controller asks again then. Every detector is also
	// asked again every poll_interval while requests wait, which is what
	// the utilization detector, whose replicas report on their own
	// schedule, relies on.
	Recheck <-chan struct{}
}

// InFlight is what a controller has dispatched and not yet had released.
type InFlight struct {
	Requests int64
	// Tokens sums the dispatched requests' estimated token costs.
	Tokens int64
}

// saturated is the gate rule shared by every detector: closed at a load
// of 1 or more, and closed on NaN (a broken detector must not open the
// floodgates).
func saturated(load float64) bool { return !(load < 1) }
