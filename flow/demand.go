package flow

import "github.com/sluice-router/sluice/flow/policies"

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

// flowKey names a flow within its band.
type flowKey struct {
	prio int
	id   string
}

// trackFlowsLocked keeps per-flow in-flight counts while the detector
// watches demand; other detectors pay nothing for them.
func (c *Controller) trackFlowsLocked() {
	if _, ok := c.det.(DemandWatcher); !ok {
		c.perFlow = nil
		return
	}
	if c.perFlow == nil {
		c.perFlow = map[flowKey]*InFlight{}
	}
}

// countFlowLocked adds (sign +1) or removes (-1) a dispatched request of
// flow k from the per-flow counts, when they are kept.
func (c *Controller) countFlowLocked(k flowKey, tokens int64, sign int64) {
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

// WithFlowDemand runs fn under the controller's lock with what is in
// flight and queued, in all and per flow (only flows holding or waiting
// for something). Queued tokens are summed only when tokens is true (it
// walks the queues). fn must be quick and must not call the controller.
func (c *Controller) WithFlowDemand(tokens bool, fn func(inFlight, queued InFlight, flows []FlowDemand)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := map[flowKey]int{}
	var flows []FlowDemand
	at := func(k flowKey) *FlowDemand {
		i, ok := idx[k]
		if !ok {
			i = len(flows)
			idx[k] = i
			flows = append(flows, FlowDemand{Priority: k.prio, FlowID: k.id})
		}
		return &flows[i]
	}
	for k, f := range c.perFlow {
		at(k).InFlight = *f
	}
	for _, b := range c.bands {
		for id, q := range b.flows {
			d := at(flowKey{b.cfg.Priority, id})
			d.Queued.Requests += int64(q.Len())
			if tokens {
				q.Each(func(it *policies.Item) { d.Queued.Tokens += it.Value.(*waiter).req.Tokens })
			}
		}
	}
	fn(c.inFlight, InFlight{Requests: int64(c.queued), Tokens: c.tokens}, flows)
}

// belowShareLocked is the backlogged flow of band b furthest below its
// share at this instance, when the detector shares the pool per flow;
// nil otherwise.
func (c *Controller) belowShareLocked(b *band) *policies.Queue {
	fs, ok := c.det.(FlowSharer)
	if !ok || c.perFlow == nil {
		return nil
	}
	var best *policies.Queue
	bestDeficit := 0.0
	for id, q := range b.flows {
		var in InFlight
		if f := c.perFlow[flowKey{b.cfg.Priority, id}]; f != nil {
			in = *f
		}
		if d, ok := fs.ShareDeficit(b.cfg.Priority, id, in); ok && d > bestDeficit {
			best, bestDeficit = q, d
		}
	}
	return best
}
