package kvevents

import (
	"time"
)

// Prefixes answers, for a request, how much of its prompt each replica's
// engine holds, from the index: the cache_aware policy's exact view.
type Prefixes struct {
	Index     *Index
	Tokenizer Tokenizer
	// FreshFor: a replica with no batch for longer is not fresh (its
	// events stopped, or it never published) and is scored by the
	// approximate tree instead (default 30s).
	FreshFor time.Duration
	// SpeculateFor: what was just routed to a replica counts as held for
	// this long, until its events say (default 2s; negative: never).
	SpeculateFor time.Duration
	Now          func() time.Time // default time.Now
}

func (p *Prefixes) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Lookup tokenizes the prompt once and returns, per addr, the share of
// the prompt (0..1) the replica's engine holds and whether its events are
// fresh, and the function to call with the replica the request went to.
// rates is nil when the prompt cannot be tokenized or is shorter than one
// block (the tree alone decides).
func (p *Prefixes) Lookup(model, text string, addrs []string) (rates []float64, fresh []bool, routed func(addr string)) {
	tokens, ok := p.Tokenizer.Tokenize(model, text)
	if !ok || len(tokens) == 0 {
		return nil, nil, nil
	}
	keys := p.Index.Keys(tokens)
	if len(keys) == 0 {
		return nil, nil, nil // shorter than one block: the tree decides
	}
	now := p.now()
	freshFor := p.FreshFor
	if freshFor <= 0 {
		freshFor = 30 * time.Second
	}
	matched := make([]int, len(addrs))
	fresh = make([]bool, len(addrs))
	p.Index.MatchFresh(keys, addrs, now, freshFor, matched, fresh)
	rates = make([]float64, len(addrs))
	bs := p.Index.BlockSize()
	for i, m := range matched {
		rates[i] = float64(m*bs) / float64(len(tokens))
	}
	ttl := p.SpeculateFor
	if ttl == 0 {
		ttl = 2 * time.Second
	}
	routed = func(addr string) {
		if ttl > 0 {
			p.Index.Speculate(addr, keys, p.now(), ttl)
		}
	}
	return rates, fresh, routed
}
