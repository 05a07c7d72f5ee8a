package cacheaware

import "github.com/sluice-router/sluice/lb"

// Exact is an exact view of what each replica's engine caches (engine KV
// events: lb/kvevents.Prefixes). Lookup returns, per addr, the share of
// the prompt (0..1) the replica holds and whether its view is fresh, and
// the function to call with the replica the request went to; rates nil
// means the prompt could not be looked up (the tree alone decides).
type Exact interface {
	Lookup(req *lb.Request, addrs []string) (rates []float64, fresh []bool, routed func(addr string))
}

// Pressured is an Exact that also knows each replica's cache pressure:
// the share (0..1) of the blocks its engine stored lately that it had
// evicted before (lb/kvevents.Index.Pressure).
type Pressured interface {
	Pressure(addrs []string) []float64
}

// PeerSpeculator is an Exact that takes another instance's routing
// decisions as its own speculative entries (lb/kvevents.Prefixes), keyed
// under the request's cache_salt as its tag (kvevents.SaltTag; "" for
// none).
type PeerSpeculator interface {
	SpeculatePeer(model, text, addr, saltTag string)
}

// PeerRouted records a routing decision another instance made (received
// through the shared tree): into the tree, and into the exact view's
// speculative entries, so that every instance knows where the prompt went
// before its engine's events say so. A decision replayed from history
// (history true: this instance just started) goes into the tree only: it
// is no news of what an engine is computing now. saltTag is the tag of
// the request's cache_salt ("" for none, and from an instance of a
// version that shared none).
func (p *Picker) PeerRouted(model, text, addr, saltTag string, history bool) {
	p.router.Insert(model, text, addr)
	if e := p.exact.Load(); e != nil && !history {
		if ps, ok := (*e).(PeerSpeculator); ok {
			ps.SpeculatePeer(model, text, addr, saltTag)
		}
	}
}

// PressureFunc gives a present replica's cache pressure (0..1).
type PressureFunc func(addr string) float64

// ExactFunc gives, for a present replica, its exact match rate and
// whether that view is fresh (false: score it by the tree).
type ExactFunc func(addr string) (rate float64, fresh bool)

// SetExact sets (nil: clears) the exact view the picker consults first.
func (p *Picker) SetExact(e Exact) {
	if e == nil {
		p.exact.Store(nil)
		return
	}
	p.exact.Store(&e)
}

// Addrs returns the present replicas in set order.
func (r *Router) Addrs() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, len(r.order))
	for i, rep := range r.order {
		out[i] = rep.addr
	}
	return out
}

// lookupExact asks the exact view about a parsed request's prompt for
// every present replica.
func (p *Picker) lookupExact(req *lb.Request) (ExactFunc, PressureFunc, func(string)) {
	e := p.exact.Load()
	if e == nil || !req.Parsed || req.Text == "" {
		return nil, nil, nil
	}
	addrs := p.router.Addrs()
	rates, fresh, routed := (*e).Lookup(req, addrs)
	if rates == nil || len(rates) != len(addrs) || len(fresh) != len(addrs) {
		return nil, nil, nil
	}
	idx := make(map[string]int, len(addrs))
	for i, a := range addrs {
		idx[a] = i
	}
	var pressure PressureFunc
	if pe, ok := (*e).(Pressured); ok {
		if q := pe.Pressure(addrs); len(q) == len(addrs) {
			pressure = func(addr string) float64 {
				if i, ok := idx[addr]; ok {
					return q[i]
				}
				return 0
			}
		}
	}
	return func(addr string) (float64, bool) {
		i, ok := idx[addr]
		if !ok {
			return 0, false
		}
		return rates[i], fresh[i]
	}, pressure, routed
}

// bestExact returns the fresh usable replicas with the highest exact rate
// (ties all) and that rate; -1 when none is fresh.
func bestExact(usable []*replica, exact ExactFunc, buf []*replica) ([]*replica, float64) {
	best := -1.0
	cand := buf[:0]
	for _, rep := range usable {
		rate, fresh := exact(rep.addr)
		switch {
		case !fresh:
		case rate > best:
			best, cand = rate, append(cand[:0], rep)
		case rate == best:
			cand = append(cand, rep)
		}
	}
	return cand, best
}
