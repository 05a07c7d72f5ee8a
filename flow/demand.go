package flow

import (
	"sync/atomic"

	"github.com/sluice-router/sluice/flow/policies"
)

// DemandFeed is what a controller publishes of its demand (what it has in
// flight and what waits, in all and per flow) for a detector that shares
// the pool with other instances (flow/redisgate). The detector makes the
// feed and reads it; the controller publishes to it (PublishDemand). So
// the detector never holds the controller, and the controller only asks
// the detector (SaturationDetector).
type DemandFeed struct {
	ctl     atomic.Pointer[Controller]
	changed chan struct{}
	// The totals as last published, for reading without the controller's
	// lock.
	inRequests, inTokens, queuedRequests, queuedTokens atomic.Int64
}

// Demand is a controller's demand at one instant.
type Demand struct {
	InFlight, Queued InFlight
	// Flows lists the flows holding or waiting for something.
	Flows []FlowDemand
}

// FlowDemand is what one flow (a tenant within a priority band) holds and
// waits for at one controller. A global gate shares the pool out over
// the flows of every instance (see flow/redisgate), so that tenant
// fairness and priority hold across instances, not only within each.
type FlowDemand struct {
	Priority int
	FlowID   string
	InFlight InFlight
	Queued   InFlight
}

// NewDemandFeed returns a feed no controller publishes to yet.
func NewDemandFeed() *DemandFeed { return &DemandFeed{changed: make(chan struct{}, 1)} }

// PublishDemand makes the controller publish its demand to f after every
// change (New refuses a feed another controller publishes to). It also
// makes the controller count what each flow has in flight, which
// Verdict.Shares needs; other controllers pay nothing for it.
func PublishDemand(f *DemandFeed) Option { return func(c *Controller) { c.feed = f } }

// Changed is ready after the demand changed. One ready value stands for
// any number of changes since the last receive.
func (f *DemandFeed) Changed() <-chan struct{} { return f.changed }

// Totals are what is in flight and queued as last published; they may
// trail the controller by an instant (Read is exact).
func (f *DemandFeed) Totals() (inFlight, queued InFlight) {
	return InFlight{Requests: f.inRequests.Load(), Tokens: f.inTokens.Load()},
		InFlight{Requests: f.queuedRequests.Load(), Tokens: f.queuedTokens.Load()}
}

// Read calls fn with the demand, per flow as well, under the controller's
// lock: nothing is dispatched or released while fn runs, so what fn sees
// in flight is exact, and whatever fn lowers (a detector's allowance) no
// dispatch can have passed meanwhile. Queued tokens per flow are summed
// only when tokens is true (it walks the queues). fn must be quick and
// must not call the controller. With no controller publishing yet, fn
// gets no demand.
func (f *DemandFeed) Read(tokens bool, fn func(Demand)) {
	c := f.ctl.Load()
	if c == nil {
		fn(Demand{})
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	fn(c.demandLocked(tokens))
}

// publish records the controller's totals and signals the change; the
// controller calls it under its lock.
func (f *DemandFeed) publish(inFlight, queued InFlight) {
	f.inRequests.Store(inFlight.Requests)
	f.inTokens.Store(inFlight.Tokens)
	f.queuedRequests.Store(queued.Requests)
	f.queuedTokens.Store(queued.Tokens)
	select {
	case f.changed <- struct{}{}:
	default: // a change is already signalled
	}
}

// FlowKey names a flow within its band.
type FlowKey struct {
	Priority int
	FlowID   string
}

// FlowShares is a detector's answer of how much of the pool each flow may
// use at this instance, in requests, or in tokens when Tokens is set.
type FlowShares struct {
	Tokens bool
	Of     map[FlowKey]float64
}

// deficit is how far flow k, holding inFlight here, is below its share
// (<= 0: at or above it; ok false: no share known).
func (s *FlowShares) deficit(k FlowKey, inFlight InFlight) (float64, bool) {
	share, ok := s.Of[k]
	if !ok {
		return 0, false
	}
	used := inFlight.Requests
	if s.Tokens {
		used = inFlight.Tokens
	}
	return share - float64(used), true
}

// publishLocked tells the feed, if any, what the controller holds and
// queues now.
func (c *Controller) publishLocked() {
	if c.feed != nil {
		c.feed.publish(c.inFlight, InFlight{Requests: int64(c.queued), Tokens: c.tokens})
	}
}

// countFlowLocked adds (sign +1) or removes (-1) a dispatched request of
// flow k from the per-flow counts, when they are kept.
func (c *Controller) countFlowLocked(k FlowKey, tokens int64, sign int64) {
	if c.perFlow == nil {
		return
	}
	f := c.perFlow[k]
	if f == nil {
		if sign < 0 {
			return // counted before tracking began
		}
		f = &InFlight{}
		c.perFlow[k] = f
	}
	f.Requests += sign
	f.Tokens += sign * tokens
	if f.Requests <= 0 {
		delete(c.perFlow, k)
	}
}

// demandLocked is what is in flight and queued, in all and per flow.
func (c *Controller) demandLocked(tokens bool) Demand {
	d := Demand{InFlight: c.inFlight, Queued: InFlight{Requests: int64(c.queued), Tokens: c.tokens}}
	idx := map[FlowKey]int{}
	at := func(k FlowKey) *FlowDemand {
		i, ok := idx[k]
		if !ok {
			i = len(d.Flows)
			idx[k] = i
			d.Flows = append(d.Flows, FlowDemand{Priority: k.Priority, FlowID: k.FlowID})
		}
		return &d.Flows[i]
	}
	for k, f := range c.perFlow {
		at(k).InFlight = *f
	}
	for _, b := range c.bands {
		for id, q := range b.flows {
			fd := at(FlowKey{b.cfg.Priority, id})
			fd.Queued.Requests += int64(q.Len())
			if tokens {
				q.Each(func(it *policies.Item) { fd.Queued.Tokens += it.Value.(*waiter).req.Tokens })
			}
		}
	}
	return d
}

// belowShareLocked is the backlogged flow of band b furthest below its
// share at this instance, when the detector answered shares and the
// controller counts per flow; nil otherwise.
func (c *Controller) belowShareLocked(b *band, shares *FlowShares) *policies.Queue {
	if shares == nil || c.perFlow == nil {
		return nil
	}
	var best *policies.Queue
	bestDeficit := 0.0
	for id, q := range b.flows {
		k := FlowKey{b.cfg.Priority, id}
		var in InFlight
		if f := c.perFlow[k]; f != nil {
			in = *f
		}
		if d, ok := shares.deficit(k, in); ok && d > bestDeficit {
			best, bestDeficit = q, d
		}
	}
	return best
}
