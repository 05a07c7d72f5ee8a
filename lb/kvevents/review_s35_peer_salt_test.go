package kvevents

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// A peer instance's routing decision is speculated on this instance keyed
// exactly as that instance keyed its own: under the request's cache_salt,
// which travels as its tag (a fixed-size digest: the salt itself, a
// tenant's secret, never leaves the instance). A decision without a tag
// (an instance of the previous version) means what it meant: unsalted.
func TestReviewS35PeerSpeculationKeepsTheSalt(t *testing.T) {
	now := t0
	clock := func() time.Time { return now }
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 8)
	plain := func() *lb.Request { return &lb.Request{Model: "m", Text: text, Parsed: true} }
	salted := func(salt string) *lb.Request {
		r := plain()
		r.CacheSalt = salt
		return r
	}
	replicas := []string{"a", "b"}
	newPeer := func() *Prefixes {
		return &Prefixes{Index: NewIndex(Config{}), Tokenizer: SimTokenizer{}, Now: clock}
	}
	rateOn := func(p *Prefixes, req *lb.Request) float64 {
		rates, _, _ := p.Lookup(req, replicas)
		return rates[0]
	}

	// instance A routes a request salted "tenant-1" to a
	local := newPeer()
	_, _, routed := local.Lookup(salted("tenant-1"), replicas)
	routed("a")
	full := rateOn(local, salted("tenant-1"))
	if full == 0 || rateOn(local, plain()) != 0 {
		t.Fatal("the local speculation is not keyed under the salt")
	}

	// instance B learns it from the shared decision, with the salt's tag
	b := newPeer()
	b.SpeculatePeer("m", text, "a", SaltTag("tenant-1"))
	if r := rateOn(b, plain()); r != 0 {
		t.Fatalf("an unsalted request sees the peer's salted placement: rate %v, want 0", r)
	}
	if r := rateOn(b, salted("tenant-2")); r != 0 {
		t.Fatalf("a request of another salt sees it: rate %v, want 0", r)
	}
	if r := rateOn(b, salted("tenant-1")); r != full {
		t.Fatalf("a request of the same salt: rate %v, want %v (as on the instance that routed it)", r, full)
	}

	// the previous version's message (no tag): unsalted, as before
	c := newPeer()
	c.SpeculatePeer("m", text, "a", "")
	if rateOn(c, plain()) != full || rateOn(c, salted("tenant-1")) != 0 {
		t.Fatal("an untagged peer decision is not speculated unsalted")
	}

	// a tag that is not one (the stream is outside input): not speculated
	for _, tag := range []string{"x", strings.Repeat("a", 31), strings.Repeat("A", 32), strings.Repeat("0", 33), strings.Repeat("z", 32), SaltTag("t") + "\x00"} {
		d := newPeer()
		d.SpeculatePeer("m", text, "a", tag)
		if rateOn(d, plain()) != 0 || rateOn(d, salted("t")) != 0 {
			t.Fatalf("tag %q was speculated", tag)
		}
	}
	if tag := SaltTag("tenant-1"); len(tag) != 32 || !ValidSaltTag(tag) || SaltTag("") != "" || strings.Contains(tag, "tenant") {
		t.Fatalf("SaltTag(tenant-1) = %q", tag)
	}
}

// An engine's salted blocks (vLLM puts the cache_salt in the first
// block's extra_keys) and a salted request still meet under the tag.
func TestReviewS35SaltedEventsMatchSaltedRequests(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(5000, 32)
	extra := []any{[]any{"tenant-1"}, nil}
	ix.Apply("a", mustMessage(t, topicA, 1, namedBatch(t,
		vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, nil, nil, extra))), t0)
	p := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}, SpeculateFor: -1, Now: func() time.Time { return t0 }}
	req := idsReq("m", prompt)
	req.CacheSalt = "tenant-1"
	if rates, _, _ := p.Lookup(req, []string{"a"}); rates[0] != 1 {
		t.Fatalf("salted request: rate %v, want 1", rates[0])
	}
}

// A prompt given as token ids travels in the shared decision as its Text
// (lb/reqtext.TokenIDsMark, then the ids): the peer keys the ids, as the
// instance that routed it did, not the text of their digits.
func TestReviewS35PeerSpeculationOfTokenIDs(t *testing.T) {
	prompt := seqTokens(4000, 64)
	req := idsReq("m", prompt)
	p := &Prefixes{Index: NewIndex(Config{}), Tokenizer: SimTokenizer{}, Now: func() time.Time { return t0 }}
	p.SpeculatePeer("m", "\u2029"+req.Text, "a", "")
	if rates, _, _ := p.Lookup(req, []string{"a"}); rates[0] != 1 {
		t.Fatalf("a peer's token-id prompt: rate %v, want 1", rates[0])
	}
}
