package caddymodule

import (
	"encoding/binary"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/kvevents"
)

// storeKVBlockAs has replica's engine publish the block of prompt as vLLM
// does (named form), with the given fields besides the block's own.
func storeKVBlockAs(t *testing.T, kl *kvListener, replica string, seq uint64, prompt string, fields map[string]any) {
	t.Helper()
	ids, _ := kvevents.SimTokenizer{}.Tokenize("m", prompt)
	tokens := make([]any, len(ids))
	for i, id := range ids {
		tokens[i] = id
	}
	ev := map[string]any{"type": "BlockStored", "block_hashes": []any{seq}, "parent_block_hash": nil,
		"token_ids": tokens, "block_size": 16, "medium": "GPU"}
	for k, v := range fields {
		ev[k] = v
	}
	payload, err := msgpack.Marshal(map[string]any{"ts": 1.5, "data_parallel_rank": 0, "events": []any{ev}})
	if err != nil {
		t.Fatal(err)
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	kl.l.Inject([][]byte{[]byte("kv@" + replica + "@m"), s[:], payload})
}

// storeKVLoRABlock: the block as vLLM stores it for a request of LoRA
// adapter lora: lora_id, lora_name and the name in its extra_keys.
func storeKVLoRABlock(t *testing.T, kl *kvListener, replica string, seq uint64, prompt, lora string) {
	t.Helper()
	storeKVBlockAs(t, kl, replica, seq, prompt, map[string]any{"lora_id": 1, "lora_name": lora, "extra_keys": []any{[]any{lora}}})
}

func pickKVModel(t *testing.T, pk *cacheaware.Picker, model, text string) cacheaware.Decision {
	t.Helper()
	return pickKVRequest(t, pk, &lb.Request{Model: model, Text: text, Parsed: true})
}

// A replica whose engine holds a prompt only as LoRA adapter ada's blocks
// is no exact cache hit for the base model's request of that prompt
// (vLLM hashes the adapter's name into each block: it recomputes), and
// the adapter's request goes there.
func TestKVReviewS34LoRABlocksAreNotTheBaseModels(t *testing.T) {
	_, a, _, pk, kl := provisionKVPool(t)
	storeKVLoRABlock(t, kl, a, 1, kvPromptA, "ada")
	if d := pickKVModel(t, pk, "m", kvPromptA); d.Exact && d.Addr == a {
		t.Fatalf("the base model's request is an exact hit on %s, which holds only adapter ada's copy: %+v", a, d)
	}
	if d := pickKVModel(t, pk, "ada", kvPromptA); !d.Exact || d.Addr != a || d.Reason != cacheaware.CacheHit {
		t.Fatalf("adapter ada's request: %+v, want an exact cache hit on %s", d, a)
	}
}

// storeKVSaltedBlock: the block as vLLM stores it for a request with
// cache_salt salt: the salt in its first block's extra_keys.
func storeKVSaltedBlock(t *testing.T, kl *kvListener, replica string, seq uint64, prompt, salt string) {
	t.Helper()
	storeKVBlockAs(t, kl, replica, seq, prompt, map[string]any{"extra_keys": []any{[]any{salt}}})
}

// A request with a cache_salt is an exact hit only where the engine
// holds the prompt under that same salt (vLLM hashes the salt into the
// first block): the salt reaches the lookup from the request's body, as
// the selector reads it.
func TestKVReviewS34ASaltedRequestFindsItsSaltedBlocks(t *testing.T) {
	name := freshPoolName("kv-salt")
	a, b := "127.0.0.1:9", "127.0.0.1:10"
	setKVPool(t, name, a, b)
	p := &CacheAware{Pool: name, kvEventsOptions: kvEventsOptions{KVEvents: "tcp://" + freeKVAddr(t),
		KVEventsTokenizer: kvTokenizerLLMDSim}}
	if err := p.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Cleanup() })
	pk := pickersOf[*cacheaware.Picker]("cache_aware")[name]
	storeKVSaltedBlock(t, kvListenerOf(t, name), b, 1, kvPromptA, "tenant-7")

	pick := func(body string) cacheaware.Decision {
		t.Helper()
		r, _, _ := newRequest(t)
		r.Body = io.NopCloser(strings.NewReader(body))
		rs, _ := requestStateFor(r)
		return pickKVRequest(t, pk, p.selector.request(rs, rs.attemptFor(r, nil, "test", measureAuto), r))
	}
	prompt := strconv.Quote(kvPromptA)
	if d := pick(`{"model":"m","prompt":` + prompt + `,"cache_salt":"tenant-7"}`); !d.Exact || d.Addr != b {
		t.Fatalf("the request salted tenant-7: %+v, want an exact hit on %s, which holds the prompt under that salt", d, b)
	}
	if d := pick(`{"model":"m","prompt":` + prompt + `}`); d.Exact && d.Addr == b {
		t.Fatalf("an unsalted request is an exact hit on %s, which holds only the salted copy: %+v", b, d)
	}
}
