package kvevents

import (
	"testing"
	"time"
)

// An adapter named by lora_id only (vLLM before it added lora_name;
// SGLang's lora_id field) cannot be matched to its requests, which name
// the adapter by name: no signal a router can read maps one to the other
// (vLLM's /v1/models lists adapters by name, its ids come from a counter
// in the API server). Its blocks are held without keys, so they take no
// key room and never match, and the events are counted where a user can
// see them.
func TestReviewS35LoRAIDOnlyCounted(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(700, 32)
	ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
		[]any{"BlockStored", anyHashes(1, 2), nil, anyTokens(prompt), 16, 7, "GPU"})), t0)
	s := ix.Stats()
	if s.EventDrops[ReasonLoraID] != 1 {
		t.Fatalf("a store under lora_id 7 alone is not counted: event drops %v", s.EventDrops)
	}
	if k := s.Replicas["a"].Keys; k != 0 {
		t.Fatalf("blocks under lora_id 7 alone hold %d keys, want 0 (no request can ask for them)", k)
	}
	// their children stay keyless, their removal is known
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t,
		[]any{"BlockStored", anyHashes(3), 2, anyTokens(seqTokens(732, 16)), 16, 7, "GPU"},
		vllmRemoved(1))), t0)
	s = ix.Stats()
	if s.Replicas["a"].Keys != 0 || s.RemovedUnknown != 0 || s.EventDrops[ReasonParent] != 0 {
		t.Fatalf("keys %d, removed unknown %d, drops %v", s.Replicas["a"].Keys, s.RemovedUnknown, s.EventDrops)
	}
	// neither the base model nor any adapter name matches them
	p := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}, SpeculateFor: -1, Now: func() time.Time { return t0 }}
	for _, model := range []string{"m", "7", "ada"} {
		if rates, _, _ := p.Lookup(idsReq(model, prompt), []string{"a"}); rates[0] != 0 {
			t.Fatalf("model %q: rate %v, want 0", model, rates[0])
		}
	}
}
