package cacheaware

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// Picker is the cache-aware policy's lb.Picker: the Router (which replica
// holds which prompt prefixes) together with a tracker of exact in-flight
// counts and passive health. Safe for concurrent use.
type Picker struct {
	// setMu serialises SetReplicas and Configure: each writes the router
	// and the tracker in turn, and two interleaved calls would leave them
	// with different sets (every pick then finds its replica unusable).
	setMu   sync.Mutex
	router  *Router
	tracker *tracker.Tracker
	// onInsert, when set, also gets every insert of this picker's own
	// routing decisions, with the request's cache_salt
	// (share.Sharer.Publish: many instances, one view).
	onInsert atomic.Pointer[func(model, text, addr, salt string)]
	// exact, when set, is consulted before the tree (see SetExact).
	exact atomic.Pointer[Exact]
	// capacity, when set, sizes the caches for a miss (see SetCapacity);
	// backends is the set last given to SetBackends, for a late source.
	capacity atomic.Pointer[Capacity]
	backends []lb.Backend
}

// OnInsert sets (nil: clears) the function that also gets the prompt of
// every request this picker routed, and its cache_salt, after the local
// insert. It must not block (the request waits for it).
func (p *Picker) OnInsert(f func(model, text, addr, salt string)) {
	if f == nil {
		p.onInsert.Store(nil)
		return
	}
	p.onInsert.Store(&f)
}

// NewPicker returns a picker with no replicas; Run its eviction loop.
func NewPicker(rc Config, tc tracker.Config) *Picker {
	return &Picker{router: New(rc), tracker: tracker.New(tc)}
}

// Configure applies new settings in place, keeping trees and counts.
func (p *Picker) Configure(rc Config, tc tracker.Config) {
	p.setMu.Lock()
	defer p.setMu.Unlock()
	p.router.Configure(rc)
	p.tracker.Configure(tc)
}

// Run trims the trees periodically until ctx ends.
func (p *Picker) Run(ctx context.Context) { p.router.Run(ctx) }

// Router and Tracker give metrics and health their view.
func (p *Picker) Router() *Router           { return p.router }
func (p *Picker) Tracker() *tracker.Tracker { return p.tracker }

// PickerSettings is what a Picker runs with.
type PickerSettings struct {
	Router  Config
	Tracker tracker.Config
}

// Settings returns the configuration in force.
func (p *Picker) Settings() any {
	return PickerSettings{Router: p.router.Config(), Tracker: p.tracker.Config()}
}

// SetReplicas implements lb.Picker; a capacity source reads each replica
// at http://addr.
func (p *Picker) SetReplicas(addrs []string) {
	p.SetBackends(lb.PlainBackends(addrs))
}

func (p *Picker) setReplicasLocked(addrs []string) {
	// The new replicas join the tracker before picks read them from the
	// router, and the old ones leave it only after: a pick finds every
	// replica the router gave it in the tracker, or (its choice removed
	// meanwhile) picks again from the new set.
	p.tracker.SetReplicas(slices.Concat(p.router.Addrs(), addrs))
	p.router.SetReplicas(addrs)
	p.tracker.SetReplicas(addrs)
}

// InFlight implements lb.Picker.
func (p *Picker) InFlight() map[string]int { return p.tracker.PerReplica() }

// pickTries bounds re-picks when the chosen replica is lost between the
// pick and the acquire (a set-backends racing the request, or another
// pick taking a recovering replica's one probe).
const pickTries = 3

// Pick implements lb.Picker: the longest cached prefix unless the pool is
// imbalanced or the match is poor (see Router.Pick), among the replicas
// that are present, healthy and not in req.Unavailable: none of those
// gives lb.ErrAllDown, an empty pool lb.ErrNoBackends. The prompt of a
// parsed request is recorded for the replica that got it. The lease is
// the tracker's, costed at req.Tokens.
func (p *Picker) Pick(ctx context.Context, req *lb.Request) (lb.Lease, error) {
	l, _, err := p.PickDecision(ctx, req)
	return l, err
}

// PickDecision is Pick, with the Decision that chose the replica. Pick
// does not keep it in req.Memo: boxing it cost an allocation on every
// request, for a value nothing on the request path reads.
func (p *Picker) PickDecision(ctx context.Context, req *lb.Request) (lb.Lease, Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, Decision{}, err
	}
	if req == nil {
		req = &lb.Request{}
	}
	load := p.tracker.Load
	if len(req.Unavailable)+len(req.Avoid) > 0 {
		load = func(addr string) (int, bool) {
			n, ok := p.tracker.Load(addr)
			return n, ok && !req.Excluded(addr)
		}
	}
	text := ""
	if req.Parsed {
		text = req.Text
	}
	exact, pressure, routed := p.lookupExact(req)
	capacity := p.capacityFunc()
	for tries := 0; tries < pickTries; tries++ {
		d := p.router.decide(req.Model, text, load, exact, pressure, capacity)
		switch {
		case d.Reason == NoUsable:
			return nil, d, lb.ErrAllDown
		case d.Addr == "":
			return nil, Decision{}, lb.ErrNoBackends
		}
		// Checked and counted at once: a recovering replica that Load
		// found idle takes one probe, not one per pick that read it.
		l := p.tracker.AcquireUsable(d.Addr, req.Tokens)
		if l == nil {
			continue // removed, down, or its probe taken since: pick again
		}
		p.router.count(d)
		if routed != nil {
			routed(d.Addr)
		}
		if text != "" {
			p.router.Insert(req.Model, text, d.Addr)
			if f := p.onInsert.Load(); f != nil {
				(*f)(req.Model, text, d.Addr, req.CacheSalt)
			}
		}
		req.Reason = p.reason(d.Reason, text)
		return l, d, nil
	}
	return nil, Decision{}, lb.ErrNoBackends
}

// reason names the rule that chose (lb.Request.Reason). A request
// without a prompt is routed by load alone, whatever the miss policy.
func (p *Picker) reason(r Reason, text string) string {
	switch {
	case r == CacheHit:
		return lb.ReasonPrefixMatch
	case r == Imbalance:
		return lb.ReasonImbalanced
	case text != "" && p.router.Config().MissPolicy == MissSmallestTree:
		return lb.ReasonSmallestTree
	}
	return lb.ReasonLeastLoad
}

// Config is the configuration the router runs with now.
func (r *Router) Config() Config {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cfg
}

var _ lb.Picker = (*Picker)(nil)
