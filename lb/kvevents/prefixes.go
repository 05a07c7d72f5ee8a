package kvevents

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/reqtext"
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
	// IsReplica, when set, says whether addr is one of the pool's
	// replicas: SpeculatePeer takes a peer's decision only for one. The
	// peer's addr comes from the pool's Redis stream (outside input), and
	// the index makes a replica of each name it speculates on.
	IsReplica func(addr string) bool
	Now       func() time.Time // default time.Now
}

// speculateFor is SpeculateFor with its default (2s; negative: never).
func (p *Prefixes) speculateFor() time.Duration {
	if p.SpeculateFor == 0 {
		return 2 * time.Second
	}
	return p.SpeculateFor
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
// rates is nil when the prompt cannot be tokenized (yet) or is shorter
// than one block (the tree alone decides). A prompt given as token ids is
// keyed by them; a PromptTokenizer gets the whole request and the
// replicas it may ask.
func (p *Prefixes) Lookup(req *lb.Request, addrs []string) (rates []float64, fresh []bool, routed func(addr string)) {
	if req == nil || !req.Parsed || req.Text == "" {
		return nil, nil, nil
	}
	var tokens []uint32
	var total int
	ok := false
	switch pt, isPrompt := p.Tokenizer.(PromptTokenizer); {
	case req.TokenIDs:
		tokens, ok = parseIDs(req.Text)
		total = len(tokens)
	case isPrompt:
		tokens, total, ok = pt.TokenizePrompt(Prompt{Model: req.Model, Text: req.Text, Messages: req.Messages, Replicas: addrs})
	default:
		tokens, ok = p.Tokenizer.Tokenize(req.Model, req.Text)
		total = len(tokens)
	}
	if !ok || len(tokens) == 0 {
		return nil, nil, nil
	}
	total = max(total, len(tokens))
	// Under the request's adapter when its model names one (a LoRA
	// adapter's blocks are no use to the base model, nor the reverse),
	// and its cache_salt.
	keys := p.Index.KeysFor(req.Model, req.CacheSalt, tokens)
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
		rates[i] = float64(m*bs) / float64(total)
	}
	ttl := p.speculateFor()
	routed = func(addr string) {
		if ttl > 0 {
			p.Index.Speculate(addr, keys, p.now(), ttl)
		}
	}
	return rates, fresh, routed
}

// SpeculatePeer records what another Sluice instance just routed (a
// peer's insert into the shared tree: its model, prompt text, replica and
// the SaltTag of the request's cache_salt, "" for none) as this index's
// speculative entry, keyed as that instance keyed its own: instances that
// share a tree then agree on where a prompt went before its engine's
// events arrive, as one instance does. A tag that is not one (the stream
// is outside input) is not speculated: keyed unsalted, a salted request's
// placement would be a hit for every unsalted request of that prompt. A
// text it cannot tokenize now (an engine tokenizer's cache miss) is left
// to the tree.
func (p *Prefixes) SpeculatePeer(model, text, addr, saltTag string) {
	ttl := p.speculateFor()
	if ttl < 0 || text == "" || p.IsReplica != nil && !p.IsReplica(addr) {
		return
	}
	if saltTag != "" && !ValidSaltTag(saltTag) {
		return
	}
	var tokens []uint32
	var ok bool
	switch pt, isPrompt := p.Tokenizer.(PromptTokenizer); {
	case strings.HasPrefix(text, reqtext.TokenIDsMark):
		// a prompt of token ids, keyed by its ids as Lookup keyed it
		tokens, ok = parseIDs(text)
	case isPrompt:
		tokens, _, ok = pt.TokenizePrompt(Prompt{Model: model, Text: text})
	default:
		tokens, ok = p.Tokenizer.Tokenize(model, text)
	}
	if !ok || len(tokens) == 0 {
		return
	}
	if keys := p.Index.keysForTag(model, saltTag, tokens); len(keys) > 0 {
		p.Index.Speculate(addr, keys, p.now(), ttl)
	}
}

// Pressure is the index's re-store share per replica (Index.Pressure):
// the policy moves a prefix its home lost off a replica whose engine keeps
// evicting what it is then asked for.
func (p *Prefixes) Pressure(addrs []string) []float64 { return p.Index.Pressure(addrs) }

// parseIDs reads the first prompt of a token-id prompt (lb.Request.Text:
// decimal ids, space-separated; prompts joined by "\n").
func parseIDs(text string) ([]uint32, bool) {
	if i := strings.IndexByte(text, '\n'); i >= 0 {
		text = text[:i]
	}
	if len(text) > maxTokenizeBytes {
		return nil, false
	}
	out := make([]uint32, 0, len(text)/4+1)
	for _, f := range strings.Fields(text) {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, false
		}
		out = append(out, uint32(v))
	}
	return out, len(out) > 0
}
