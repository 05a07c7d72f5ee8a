package kvevents

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// vLLM's BlockStored as it publishes it today (msgspec tag=True without
// array_like: a map), with lora_id, lora_name and extra_keys: one entry
// per block, the keys vLLM adds to that block's hash (the LoRA name,
// then (mm identifier, offset) pairs, then the cache_salt on the first
// block, then a prompt-embeds hash).
func vllmNamedStored(hashes []any, parent any, tokens []uint32, bs int, loraID any, loraName any, extra any) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
		"token_ids": anyTokens(tokens), "block_size": bs, "lora_id": loraID, "medium": "GPU",
		"lora_name": loraName, "extra_keys": extra}
}

func namedBatch(t testing.TB, events ...any) []byte {
	return pack(t, map[string]any{"ts": 1.5, "events": events, "data_parallel_rank": 0})
}

// idsReq is a request whose prompt is given as token ids, for model.
func idsReq(model string, tokens []uint32) *lb.Request {
	s := make([]string, len(tokens))
	for i, v := range tokens {
		s[i] = strconv.FormatUint(uint64(v), 10)
	}
	return &lb.Request{Model: model, Text: strings.Join(s, " "), Parsed: true, TokenIDs: true}
}

func loraExtra(name string, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = []any{name}
	}
	return out
}

// Blocks a LoRA adapter computed are of no use to a request of the base
// model (vLLM hashes the adapter's name into every block), nor the base
// model's to the adapter's requests: the index keeps them apart.
func TestReviewS34BaseRequestDoesNotMatchLoRABlocks(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(500, 64) // 4 blocks
	// a: only the adapter's copy of the whole prompt
	ix.Apply("a", mustMessage(t, "kv@10.0.0.1:8000@m", 1, namedBatch(t,
		vllmNamedStored(anyHashes(1, 2, 3, 4), nil, prompt, 16, 1, "ada", loraExtra("ada", 4)))), t0)
	// b: the base model's copy of its first half
	ix.Apply("b", mustMessage(t, "kv@10.0.0.2:8000@m", 1, namedBatch(t,
		vllmNamedStored(anyHashes(11, 12), nil, prompt[:32], 16, nil, nil, nil))), t0)

	p := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}, SpeculateFor: -1, Now: func() time.Time { return t0 }}
	rates, _, _ := p.Lookup(idsReq("m", prompt), []string{"a", "b"})
	if rates[0] != 0 || rates[1] != 0.5 {
		t.Fatalf("a base-model request: rates %v, want [0 0.5] (a holds only the adapter's copy, useless to it)", rates)
	}
	rates, _, _ = p.Lookup(idsReq("ada", prompt), []string{"a", "b"})
	if rates[0] != 1 || rates[1] != 0 {
		t.Fatalf("a request of adapter ada: rates %v, want [1 0] (b holds only the base model's copy)", rates)
	}
}

// Older vLLM and SGLang name the adapter by lora_id only: its blocks are
// still not the base model's.
func TestReviewS34LoRAByIDIsNotBase(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(700, 32)
	ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
		[]any{"BlockStored", anyHashes(1, 2), nil, anyTokens(prompt), 16, 7, "GPU"})), t0)
	if got := match(ix, prompt, "a"); got[0] != 0 {
		t.Fatalf("a base-model prompt matched %d blocks stored under lora_id 7, want 0", got[0])
	}
}

// A block whose hash has a multimodal identifier in it (an image's
// placeholder tokens are the same for every image) cannot be keyed from
// the token ids: the blocks before it can, it and those after it not.
// Its event is counted (extra_keys); its children and its removal are
// still recognised (no unknown_parent, no removed_unknown).
func TestReviewS34MultimodalBlocksAreNotKeyed(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(900, 64) // 4 blocks; the image's placeholders in block 1
	extra := []any{nil, []any{[]any{"img-sha", 3}}, nil, nil}
	ix.Apply("a", mustMessage(t, topicA, 1, namedBatch(t,
		vllmNamedStored(anyHashes(1, 2, 3), nil, prompt[:48], 16, nil, nil, extra[:3]))), t0)
	if got := match(ix, prompt, "a"); got[0] != 1 {
		t.Fatalf("a text prompt with the same token ids matched %d blocks, want 1 (the block before the image)", got[0])
	}
	// the next block of the same request, chained from an unkeyable one
	ix.Apply("a", mustMessage(t, topicA, 2, namedBatch(t,
		vllmNamedStored(anyHashes(4), uint64(3), prompt[48:], 16, nil, nil, nil))), t0)
	ix.Apply("a", mustMessage(t, topicA, 3, batchPayload(t, vllmRemoved(3))), t0)
	s := ix.Stats()
	if got := match(ix, prompt, "a"); got[0] != 1 || s.EventDrops[ReasonExtraKeys] != 1 ||
		s.EventDrops[ReasonParent] != 0 || s.RemovedUnknown != 0 {
		t.Fatalf("matched %d (want 1), event drops %v (want extra_keys 1 only), removed unknown %d (want 0)",
			got[0], s.EventDrops, s.RemovedUnknown)
	}
}

// vLLM hashes a request's cache_salt into its first block: the salted
// chain is keyed under the salt (and the adapter), found only by a request
// with that salt.
func TestReviewS34SaltedChainsAreApart(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(1300, 48)
	ix.Apply("a", mustMessage(t, topicA, 1, namedBatch(t,
		vllmNamedStored(anyHashes(1, 2), nil, prompt[:32], 16, nil, nil, []any{[]any{"s1"}, nil}))), t0)
	// the same request's next block, in its own event, chained by parent
	ix.Apply("a", mustMessage(t, topicA, 2, namedBatch(t,
		vllmNamedStored(anyHashes(3), uint64(2), prompt[32:], 16, nil, nil, nil))), t0)
	// an adapter's salted chain: (name, salt) on the first block, the name after
	ix.Apply("b", mustMessage(t, "kv@10.0.0.2:8000@m", 1, namedBatch(t,
		vllmNamedStored(anyHashes(1, 2, 3), nil, prompt, 16, 2, "ada", []any{[]any{"ada", "s1"}, []any{"ada"}, []any{"ada"}}))), t0)
	for _, c := range []struct {
		model, salt string
		want        [2]int
	}{
		{"m", "", [2]int{0, 0}},
		{"m", "s1", [2]int{3, 0}},
		{"m", "s2", [2]int{0, 0}},
		{"ada", "", [2]int{0, 0}},
		{"ada", "s1", [2]int{0, 3}},
	} {
		got := ix.Match(ix.KeysFor(c.model, c.salt, prompt), []string{"a", "b"})
		if got[0] != c.want[0] || got[1] != c.want[1] {
			t.Errorf("model %q salt %q: matched %v, want %v", c.model, c.salt, got, c.want)
		}
	}
	if s := ix.Stats(); len(s.EventDrops) != 0 || s.Events != 3 {
		t.Fatalf("salted chains are keyed, not dropped: events %d, event drops %v", s.Events, s.EventDrops)
	}
}

// What extra_keys Sluice cannot tell apart keeps a block unkeyed: a string
// after the first block where no adapter explains it, entries that are
// not one per block, an adapter name too long to keep. The message's
// other events apply; the blocks are held (their removal is known).
func TestReviewS34UnreproducibleExtraKeys(t *testing.T) {
	prompt := seqTokens(1500, 32)
	long := strings.Repeat("x", maxLoraName+1)
	for name, ev := range map[string]any{
		"string on block 1":  vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, nil, nil, []any{[]any{"salt"}, []any{"what"}}),
		"prompt embeds":      vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, nil, nil, []any{[]any{[]byte{1, 2}}, nil}),
		"three strings":      vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, 1, "ada", []any{[]any{"ada", "s", "t"}, []any{"ada"}}),
		"not one per block":  vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, nil, nil, []any{nil}),
		"not a list":         vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, nil, nil, "salt"),
		"entry not a list":   vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, nil, nil, []any{"salt", nil}),
		"adapter name >1KiB": vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, 1, long, loraExtra(long, 2)),
	} {
		t.Run(name, func(t *testing.T) {
			ix := NewIndex(Config{})
			ix.Apply("a", mustMessage(t, topicA, 1, namedBatch(t, ev,
				vllmNamedStored(anyHashes(9), nil, seqTokens(4000, 16), 16, nil, nil, nil))), t0)
			s := ix.Stats()
			if m := match(ix, prompt, "a"); m[0] != 0 || s.EventDrops[ReasonExtraKeys] != 1 || s.Events != 1 || s.Replicas["a"].Blocks != 3 {
				t.Fatalf("matched %d (want 0), event drops %v (want extra_keys 1), events %d (want 1), blocks %d (want 3: held unkeyed)",
					m[0], s.EventDrops, s.Events, s.Replicas["a"].Blocks)
			}
			ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, vllmRemoved(1, 2))), t0)
			if s := ix.Stats(); s.RemovedUnknown != 0 || s.Replicas["a"].Blocks != 1 {
				t.Fatalf("removal of the unkeyed blocks: removed unknown %d, blocks %d, want 0 and 1", s.RemovedUnknown, s.Replicas["a"].Blocks)
			}
		})
	}
}

// The positional form (array_like: SGLang, older vLLM, the sim) carries
// lora_name and extra_keys after medium.
func TestReviewS34PositionalLoRA(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(1700, 32)
	ix.Apply("a", mustMessage(t, topicA, 1, batchPayload(t,
		[]any{"BlockStored", anyHashes(1, 2), nil, anyTokens(prompt), 16, 3, "GPU", "ada", loraExtra("ada", 2), 0})), t0)
	if got := ix.Match(ix.KeysFor("m", "", prompt), []string{"a"}); got[0] != 0 {
		t.Fatalf("base model matched %d blocks of adapter ada, want 0", got[0])
	}
	if got := ix.Match(ix.KeysFor("ada", "", prompt), []string{"a"}); got[0] != 2 {
		t.Fatalf("adapter ada matched %d of its 2 blocks", got[0])
	}
}

// A removed adapter block stored again keeps its adapter's keys (tombs),
// and what was routed for an adapter's request counts only for the
// adapter's requests.
func TestReviewS34AdapterTombsAndSpeculation(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(1900, 32)
	stored := func(seq uint64) {
		ix.Apply("a", mustMessage(t, topicA, seq, namedBatch(t,
			vllmNamedStored(anyHashes(1, 2), nil, prompt, 16, 1, "ada", loraExtra("ada", 2)))), t0)
	}
	stored(1)
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, vllmRemoved(1, 2))), t0)
	stored(3)
	if got := ix.Match(ix.KeysFor("ada", "", prompt), []string{"a"}); got[0] != 2 || ix.Stats().ReStored != 2 {
		t.Fatalf("stored again: matched %d, re-stored %d; want 2 and 2", got[0], ix.Stats().ReStored)
	}
	if got := ix.Match(ix.KeysFor("m", "", prompt), []string{"a"}); got[0] != 0 {
		t.Fatalf("base model matched %d blocks of adapter ada, want 0", got[0])
	}
	p := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}, Now: func() time.Time { return t0 }}
	other := seqTokens(5000, 32)
	_, _, routed := p.Lookup(idsReq("ada", other), []string{"b"})
	routed("b")
	if rates, _, _ := p.Lookup(idsReq("m", other), []string{"b"}); rates[0] != 0 {
		t.Fatalf("a base-model request counted adapter ada's speculative blocks: rate %v", rates[0])
	}
	if rates, _, _ := p.Lookup(idsReq("ada", other), []string{"b"}); rates[0] != 1 {
		t.Fatalf("adapter ada's request: speculative rate %v, want 1", rates[0])
	}
}

// The adapters' names come from the publishers: the set is bounded, the
// names seen lately kept.
func TestReviewS34AdapterNamesBounded(t *testing.T) {
	ix := NewIndex(Config{})
	tokens := seqTokens(0, 16)
	for i := range 5 * maxAdapters {
		name := "ad-" + strconv.Itoa(i)
		ix.Apply("a", mustMessage(t, topicA, uint64(i+1), namedBatch(t,
			vllmNamedStored(anyHashes(uint64(i+1)), nil, tokens, 16, 1, name, loraExtra(name, 1)))), t0)
	}
	if n := ix.adapters.len(); n > maxAdapters {
		t.Fatalf("%d adapter names held, bound %d", n, maxAdapters)
	}
	last := "ad-" + strconv.Itoa(5*maxAdapters-1)
	if got := ix.Match(ix.KeysFor(last, "", tokens), []string{"a"}); got[0] != 1 {
		t.Fatalf("the newest adapter's request matched %d, want 1", got[0])
	}
}

// extra_keys entries cost a byte each on the wire: they count in the
// batch's block bound, as hashes do.
func TestReviewS34ExtraKeysBounded(t *testing.T) {
	extra := make([]any, 100)
	p := namedBatch(t, vllmNamedStored(anyHashes(1), nil, seqTokens(0, 16), 16, nil, nil, extra))
	if _, err := DecodeBatch(p, Limits{MaxBlocksPerBatch: 50}); ReasonOf(err) != ReasonTooMany {
		t.Fatalf("100 extra_keys entries under a 50-block batch bound: %v, want too_many", err)
	}
	if _, err := DecodeBatch(p, Limits{MaxBlocksPerEvent: 50}); ReasonOf(err) != ReasonTooMany {
		t.Fatalf("100 extra_keys entries under a 50-block event bound: %v, want too_many", err)
	}
}
