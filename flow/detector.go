package flow

// SaturationDetector is the gate of flow control: while the pool is
// saturated nothing is dispatched. Implementations must be safe for
// concurrent use; the controller calls them under its lock, so they should
// be quick and must not call back into the controller.
type SaturationDetector interface {
	// Saturation returns the pool's load as a fraction of its capacity:
	// 0 is idle, 1 or more is saturated. inFlight is what this controller
	// has dispatched and not yet had released.
	Saturation(inFlight InFlight) float64
}

// InFlight is what a controller has dispatched and not yet had released.
type InFlight struct {
	Requests int64
	// Tokens sums the dispatched requests' estimated token costs.
	Tokens int64
}

// saturated is the gate rule shared by every detector: closed at a
// saturation of 1 or more, and closed on NaN (a broken detector must not
// open the floodgates).
func saturated(s float64) bool { return !(s < 1) }

// CapacityReporter is implemented by detectors that know how many
// requests the pool serves at once. The controller sizes the queue of a
// band without max_requests from it (see BandQueueLimit); for other
// detectors the requests in flight when the queue forms stand for it.
type CapacityReporter interface {
	// Capacity is in requests; 0 means unknown now.
	Capacity() int64
}

// DemandWatcher is implemented by detectors whose capacity is acquired
// elsewhere (flow/redisgate: a share of the pool held in Redis). The
// controller calls Demand under its lock after every change to what it
// holds or queues, so the watcher always knows both; it must be quick
// and must not call back into the controller.
type DemandWatcher interface {
	// Demand reports what is in flight and what waits in the queues
	// (Requests, and the Tokens of those requests).
	Demand(inFlight, queued InFlight)
}

// FlowSharer is implemented by detectors that share the pool out per flow
// across instances (flow/redisgate). The controller then dispatches first
// from the flow furthest below its share here — the unit the pool handed
// this instance for a quiet tenant goes to that tenant, not to the
// flood's turn in the local round robin — and falls back to the band's
// fairness policy when no flow is below its share.
type FlowSharer interface {
	// ShareDeficit is how far flow id of band priority, holding inFlight
	// here, is below its share at this instance (<= 0: at or above it;
	// ok false: no share known).
	ShareDeficit(priority int, id string, inFlight InFlight) (deficit float64, ok bool)
}

// QueueSharer is implemented by detectors that share the pool with other
// instances (flow/redisgate): each instance's band queues hold its part
// of what one flow control in front of the pool would queue, so N
// instances together queue (and make wait) about as much as one.
type QueueSharer interface {
	// QueueFraction is this instance's part, in (0, 1].
	QueueFraction() float64
}
