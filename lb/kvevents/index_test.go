package kvevents

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1700000000, 0)

const topicA = "kv@10.0.0.1:8000@m"

// storeChain publishes tokens as engine blocks of engineBS, numbered from
// hash base, in one BlockStored with the given parent.
func storeChain(t *testing.T, ix *Index, name, topic string, seq uint64, base uint64, parent any, tokens []uint32, engineBS int) {
	t.Helper()
	n := len(tokens) / engineBS
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = base + uint64(i)
	}
	ix.Apply(name, mustMessage(t, topic, seq, batchPayload(t, vllmStored(anyHashes(hs...), parent, tokens[:n*engineBS], engineBS))), t0)
}

func match(ix *Index, tokens []uint32, names ...string) []int {
	return ix.Match(ix.Keys(tokens), names)
}

func TestIndexLongestPrefix(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(0, 64) // 4 blocks of 16
	storeChain(t, ix, "a", topicA, 1, 100, nil, prompt[:48], 16)
	if got := match(ix, prompt, "a", "b"); got[0] != 3 || got[1] != 0 {
		t.Fatalf("match: %v", got)
	}
	// a prompt that diverges in block 2 matches 1 block
	other := append(append([]uint32(nil), prompt[:20]...), seqTokens(9000, 44)...)
	if got := match(ix, other, "a"); got[0] != 1 {
		t.Fatalf("diverging: %v", got)
	}
	// a child stored later chains from its parent's hash
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, vllmStored(anyHashes(103), uint64(102), prompt[48:], 16))), t0)
	if got := match(ix, prompt, "a"); got[0] != 4 {
		t.Fatalf("after child: %v", got)
	}
	if got := ix.Stats(); got.Batches != 2 || got.Events != 2 || got.Replicas["a"].Blocks != 4 || !got.Replicas["a"].LastEvent.Equal(t0) {
		t.Fatalf("stats: %+v", got)
	}
}

// The engine's block size need not be Sluice's: keys come from the tokens.
func TestIndexEngineBlockSizes(t *testing.T) {
	prompt := seqTokens(7, 96) // 6 of our blocks
	for _, ebs := range []int{1, 4, 8, 16, 24, 32, 48} {
		t.Run(fmt.Sprint(ebs), func(t *testing.T) {
			ix := NewIndex(Config{})
			// two events: the second chains from the last block of the first
			first := (len(prompt) / ebs) / 2
			storeChain(t, ix, "a", topicA, 1, 1, nil, prompt[:first*ebs], ebs)
			storeChain(t, ix, "a", topicA, 2, uint64(1+first), uint64(first), prompt[first*ebs:], ebs)
			if got := match(ix, prompt, "a"); got[0] != 6 {
				t.Fatalf("engine block %d: matched %d blocks, want 6", ebs, got[0])
			}
		})
	}
}

func TestIndexRemoveEvicts(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(0, 64)
	storeChain(t, ix, "a", topicA, 1, 1, nil, prompt, 16)
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, vllmRemoved(3, 4))), t0)
	if got := match(ix, prompt, "a"); got[0] != 2 {
		t.Fatalf("after removing blocks 3,4: %v", got)
	}
	// removing the first block breaks the prefix even though 2 is still held
	ix.Apply("a", mustMessage(t, topicA, 3, batchPayload(t, vllmRemoved(1, 99))), t0)
	if got := match(ix, prompt, "a"); got[0] != 0 {
		t.Fatalf("after removing block 1: %v", got)
	}
	if s := ix.Stats(); s.RemovedUnknown != 1 || s.Replicas["a"].Blocks != 1 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestIndexUnknownParentDropped(t *testing.T) {
	ix := NewIndex(Config{})
	storeChain(t, ix, "a", topicA, 1, 5, uint64(77), seqTokens(0, 32), 16)
	if s := ix.Stats(); s.Blocks != 0 || s.EventDrops[ReasonParent] != 1 || len(s.Drops) != 0 {
		t.Fatalf("stats: %+v", s)
	}
	// the sim's positional "no parent" is 0
	storeChain(t, ix, "a", topicA, 2, 5, uint64(0), seqTokens(0, 32), 16)
	if got := match(ix, seqTokens(0, 32), "a"); got[0] != 2 {
		t.Fatalf("parent 0 as root: %v", got)
	}
}

func TestIndexGapAndRestartClear(t *testing.T) {
	ix := NewIndex(Config{})
	p := seqTokens(0, 32)
	storeChain(t, ix, "a", topicA, 1, 1, nil, p, 16)
	storeChain(t, ix, "b", "kv@10.0.0.2:8000@m", 1, 1, nil, p, 16)
	// seq 3 after 1: a gap; a's entries go, the new batch applies
	storeChain(t, ix, "a", topicA, 3, 50, nil, p[:16], 16)
	if got := match(ix, p, "a", "b"); got[0] != 1 || got[1] != 2 {
		t.Fatalf("after gap: %v", got)
	}
	// seq back to 0: the publisher restarted
	storeChain(t, ix, "a", topicA, 0, 60, nil, p[:16], 16)
	s := ix.Stats()
	if s.Gaps != 1 || s.Restarts != 1 || s.Replicas["a"].Blocks != 1 || s.Replicas["b"].Blocks != 2 {
		t.Fatalf("stats: %+v", s)
	}
	// in order again: nothing cleared
	storeChain(t, ix, "a", topicA, 1, 61, uint64(60), p[16:], 16)
	if got := match(ix, p, "a"); got[0] != 2 {
		t.Fatalf("in order after restart: %v", got)
	}
}

func TestIndexAllBlocksCleared(t *testing.T) {
	ix := NewIndex(Config{})
	storeChain(t, ix, "a", topicA, 1, 1, nil, seqTokens(0, 32), 16)
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, []any{"AllBlocksCleared"})), t0)
	if s := ix.Stats(); s.Blocks != 0 || s.Cleared != 1 || s.Replicas["a"].Keys != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestIndexCapacity(t *testing.T) {
	ix := NewIndex(Config{MaxBlocksPerReplica: 4, MaxBlocksTotal: 6})
	p := seqTokens(0, 96)
	storeChain(t, ix, "a", topicA, 1, 1, nil, p, 16) // 6 blocks, 2 oldest dropped
	if s := ix.Stats(); s.Replicas["a"].Blocks != 4 || s.CapacityEvicted != 2 {
		t.Fatalf("per replica: %+v", s)
	}
	// the oldest (the prefix head) went, so nothing matches from the start
	if got := match(ix, p, "a"); got[0] != 0 {
		t.Fatalf("match: %v", got)
	}
	storeChain(t, ix, "b", "kv@10.0.0.2:8000@m", 1, 1, nil, p[:64], 16) // total 8 > 6
	s := ix.Stats()
	if s.Blocks != 6 || s.CapacityEvicted != 4 {
		t.Fatalf("total: %+v", s)
	}
}

// Two ranks (or media) may hold the same prefix: evicting it from one keeps it.
func TestIndexSourcesShareKeys(t *testing.T) {
	ix := NewIndex(Config{})
	p := seqTokens(0, 32)
	r0 := pack(t, []any{1.0, []any{vllmStored(anyHashes(1, 2), nil, p, 16)}, 0})
	r1 := pack(t, []any{1.0, []any{vllmStored(anyHashes(1, 2), nil, p, 16)}, 1})
	ix.Apply("a", mustMessage(t, topicA, 1, r0), t0)
	ix.Apply("a", mustMessage(t, topicA, 1, r1), t0) // rank 1 has its own sequence
	ix.Apply("a", mustMessage(t, topicA, 2, pack(t, []any{1.0, []any{vllmRemoved(1, 2)}, 0})), t0)
	if got := match(ix, p, "a"); got[0] != 2 {
		t.Fatalf("rank 1 still holds it: %v", got)
	}
	if s := ix.Stats(); s.Gaps != 0 || s.Restarts != 0 || s.Replicas["a"].Blocks != 2 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestIndexForget(t *testing.T) {
	ix := NewIndex(Config{})
	storeChain(t, ix, "a", topicA, 1, 1, nil, seqTokens(0, 32), 16)
	ix.Forget("a")
	if s := ix.Stats(); s.Blocks != 0 || len(s.Replicas) != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestIndexConcurrent(t *testing.T) {
	ix := NewIndex(Config{MaxBlocksPerReplica: 64})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			topic := fmt.Sprintf("kv@10.0.0.%d:8000@m", w)
			for i := 0; i < 50; i++ {
				storeChain(t, ix, fmt.Sprint(w), topic, uint64(i), uint64(i*100), nil, seqTokens(i, 64), 16)
				match(ix, seqTokens(i, 64), "0", "1", "2", "3")
				ix.Stats()
			}
		}(w)
	}
	wg.Wait()
	if s := ix.Stats(); s.Blocks != 4*64 {
		t.Fatalf("blocks: %d", s.Blocks)
	}
}

// An engine may store a block it already reported (re-stored after a
// missed removal): the entry is replaced and stays removable.
func TestIndexRestoreSameBlock(t *testing.T) {
	ix := NewIndex(Config{})
	p := seqTokens(0, 16)
	storeChain(t, ix, "a", topicA, 1, 1, nil, p, 16)
	storeChain(t, ix, "a", topicA, 2, 1, nil, p, 16)
	if s := ix.Stats(); s.Replicas["a"].Blocks != 1 {
		t.Fatalf("after re-store: %+v", s)
	}
	// Two copies under one hash (vLLM does not de-duplicate): one
	// removal leaves the other, the second removes the block.
	ix.Apply("a", mustMessage(t, topicA, 3, batchPayload(t, vllmRemoved(1))), t0)
	if s := ix.Stats(); s.Replicas["a"].Blocks != 1 || match(ix, p, "a")[0] != 1 {
		t.Fatalf("after one copy's removal: %+v", s)
	}
	ix.Apply("a", mustMessage(t, topicA, 4, batchPayload(t, vllmRemoved(1))), t0)
	if s := ix.Stats(); s.Replicas["a"].Blocks != 0 || s.RemovedUnknown != 0 || match(ix, p, "a")[0] != 0 {
		t.Fatalf("after removal: %+v", s)
	}
}

func TestIndexSpeculateAndFresh(t *testing.T) {
	ix := NewIndex(Config{})
	p := seqTokens(0, 48)
	keys := ix.Keys(p)
	names := []string{"a", "b"}
	matched, fresh := make([]int, 2), make([]bool, 2)
	storeChain(t, ix, "a", topicA, 1, 1, nil, p[:16], 16) // a published at t0
	ix.Speculate("b", keys, t0, 2*time.Second)

	ix.MatchFresh(keys, names, t0.Add(time.Second), 30*time.Second, matched, fresh)
	if matched[0] != 1 || matched[1] != 3 || !fresh[0] || fresh[1] {
		t.Fatalf("at +1s: matched %v fresh %v", matched, fresh)
	}
	ix.MatchFresh(keys, names, t0.Add(3*time.Second), 30*time.Second, matched, fresh)
	if matched[1] != 0 {
		t.Fatalf("speculation outlived its ttl: %v", matched)
	}
	ix.MatchFresh(keys, names, t0.Add(31*time.Second), 30*time.Second, matched, fresh)
	if fresh[0] || matched[0] != 1 {
		t.Fatalf("at +31s a is stale but still holds its block: matched %v fresh %v", matched, fresh)
	}
	// speculation is bounded per replica
	many := make([]uint64, maxSpeculative+10)
	for i := range many {
		many[i] = uint64(i)
	}
	ix.Speculate("b", many, t0, time.Second)
	ix.Speculate("b", many[:5], t0, time.Second)
	ix.mu.Lock()
	n := len(ix.replicas["b"].spec)
	ix.mu.Unlock()
	if n > maxSpeculative {
		t.Fatalf("%d speculative keys", n)
	}
}

func TestPrefixesLookup(t *testing.T) {
	ix := NewIndex(Config{})
	now := t0
	px := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}, Now: func() time.Time { return now }}
	text := prompt("w", 64) // 64 dummy tokens
	toks, _ := SimTokenizer{}.Tokenize("m", text)
	storeChain(t, ix, "a", topicA, 1, 1, nil, toks[:32], 16)
	rates, fresh, routed := px.Lookup(preq(text), []string{"a", "b"})
	if rates[0] != 0.5 || rates[1] != 0 || !fresh[0] || fresh[1] {
		t.Fatalf("rates %v fresh %v", rates, fresh)
	}
	routed("b")
	if rates, _, _ = px.Lookup(preq(text), []string{"a", "b"}); rates[1] != 1 {
		t.Fatalf("after routing to b: %v", rates)
	}
	if r, _, _ := px.Lookup(preq(""), []string{"a"}); r != nil {
		t.Fatalf("empty prompt: %v", r)
	}
}

// Another instance's routing decision counts as this index's speculative
// entry for the same time, and expires like one.
func TestPrefixesSpeculatePeer(t *testing.T) {
	ix := NewIndex(Config{})
	now := t0
	px := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}, Now: func() time.Time { return now }}
	text := prompt("w", 64)
	px.SpeculatePeer("m", text, "b", "")
	if rates, _, _ := px.Lookup(preq(text), []string{"a", "b"}); rates[0] != 0 || rates[1] != 1 {
		t.Fatalf("after a peer routed to b: %v", rates)
	}
	now = now.Add(3 * time.Second) // past the default 2 s
	if rates, _, _ := px.Lookup(preq(text), []string{"a", "b"}); rates[1] != 0 {
		t.Fatalf("peer's entry did not expire: %v", rates)
	}
	px.SpeculateFor = -1 // never speculate
	px.SpeculatePeer("m", text, "a", "")
	if rates, _, _ := px.Lookup(preq(text), []string{"a", "b"}); rates[0] != 0 {
		t.Fatalf("speculated with SpeculateFor < 0: %v", rates)
	}
}

// Apply is exported: an Event built by hand with tokens that do not fill
// its blocks is dropped, not a panic.
func TestIndexInconsistentEventDropped(t *testing.T) {
	ix := NewIndex(Config{})
	m := Message{Topic: topicA, Seq: 1, Batch: Batch{Events: []Event{
		{Kind: BlockStored, BlockHashes: []BlockHash{IntHash(1), IntHash(2)}, TokenIDs: seqTokens(0, 20), BlockSize: 16},
		{Kind: BlockStored, BlockHashes: []BlockHash{IntHash(3)}, BlockSize: 0},
	}}}
	ix.Apply("a", m, t0)
	if s := ix.Stats(); s.Blocks != 0 || s.EventDrops[ReasonTokenCount] != 2 || len(s.Drops) != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

func TestPrefixesShortPromptLeftToTheTree(t *testing.T) {
	ix := NewIndex(Config{})
	px := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}}
	if r, _, _ := px.Lookup(preq(prompt("w", 15)), []string{"a"}); r != nil {
		t.Fatalf("15 tokens: %v", r)
	}
	if r, _, _ := px.Lookup(preq(prompt("w", 16)), []string{"a"}); len(r) != 1 {
		t.Fatalf("16 tokens: %v", r)
	}
}

// A block the engine removed and stores again keeps its keys: with the
// parent its event names (vLLM: the right one, and the next block chains
// from it) or another (llm-d-inference-sim refilling a hole in a prompt
// names the last block it still held).
func TestIndexReStoredBlockKeepsItsKeys(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(0, 80) // 5 blocks
	storeChain(t, ix, "a", topicA, 1, 100, nil, prompt[:64], 16)
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, vllmRemoved(101))), t0)
	if got := match(ix, prompt, "a"); got[0] != 1 {
		t.Fatalf("after the removal: %v", got)
	}
	// The sim's shape: the hole (101) and a new block (104) in one event
	// whose parent is the last held block (103).
	ix.Apply("a", mustMessage(t, topicA, 3, batchPayload(t,
		vllmStored(anyHashes(101, 104), uint64(103), append(append([]uint32(nil), prompt[16:32]...), prompt[64:]...), 16))), t0)
	if got := match(ix, prompt[:64], "a"); got[0] != 4 {
		t.Fatalf("hole refilled: %v", got)
	}
	// vLLM's shape: the tail removed, then stored again with its own
	// parent and a new block after it.
	ix.Apply("a", mustMessage(t, topicA, 4, batchPayload(t, vllmRemoved(103, 104))), t0)
	ix.Apply("a", mustMessage(t, topicA, 5, batchPayload(t, vllmStored(anyHashes(103, 105), uint64(102), prompt[48:80], 16))), t0)
	if got := match(ix, prompt, "a"); got[0] != 5 {
		t.Fatalf("tail stored again: %v", got)
	}
	// A removed block with an unknown parent: its own keys, not a drop.
	ix.Apply("a", mustMessage(t, topicA, 6, batchPayload(t, vllmRemoved(101, 102, 103, 105))), t0)
	ix.Apply("a", mustMessage(t, topicA, 7, batchPayload(t, vllmStored(anyHashes(101), uint64(999), prompt[16:32], 16))), t0)
	if got := match(ix, prompt, "a"); got[0] != 2 {
		t.Fatalf("unknown parent: %v", got)
	}
	if s := ix.Stats(); s.ReStored != 3 || s.EventDrops[ReasonParent] != 0 || s.RemovedUnknown != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// The removed blocks remembered are bounded over all replicas, oldest
// first, and a replica that leaves takes its own with it.
func TestIndexTombsBounded(t *testing.T) {
	ix := NewIndex(Config{MaxBlocksTotal: 4096}) // 1024 remembered
	for i := 0; i < 3; i++ {
		name := fmt.Sprint("r", i)
		topic := fmt.Sprintf("kv@10.0.1.%d:8000@m", i)
		storeChain(t, ix, name, topic, 1, 0, nil, seqTokens(i*100000, 16*800), 16)
		hs := make([]uint64, 800)
		for j := range hs {
			hs[j] = uint64(j)
		}
		ix.Apply(name, mustMessage(t, topic, 2, batchPayload(t, vllmRemoved(hs...))), t0)
	}
	if ix.tombs != 1024 || len(ix.replicas["r0"].tombs) != 0 || len(ix.replicas["r2"].tombs) != 800 {
		t.Fatalf("tombs %d: r0 %d, r1 %d, r2 %d", ix.tombs, len(ix.replicas["r0"].tombs), len(ix.replicas["r1"].tombs), len(ix.replicas["r2"].tombs))
	}
	ix.Forget("r2")
	if ix.tombs != 224 || len(ix.replicas["r1"].tombs) != 224 {
		t.Fatalf("after Forget: %d", ix.tombs)
	}
}

// Pressure is the share of the blocks a replica stored lately that it had
// removed before, forgetting with a 10 s half-life.
func TestIndexPressure(t *testing.T) {
	ix := NewIndex(Config{})
	prompt := seqTokens(0, 64) // 4 blocks
	storeChain(t, ix, "a", topicA, 1, 100, nil, prompt, 16)
	const topicB = "kv@10.0.0.2:8000@m"
	storeChain(t, ix, "b", topicB, 1, 100, nil, prompt, 16)
	if got := ix.Pressure([]string{"a", "b", "c"}); got[0] != 0 || got[1] != 0 || got[2] != 0 {
		t.Fatalf("new blocks only: %v", got)
	}
	ix.Apply("a", mustMessage(t, topicA, 2, batchPayload(t, vllmRemoved(101, 102, 103))), t0)
	ix.Apply("a", mustMessage(t, topicA, 3, batchPayload(t, vllmStored(anyHashes(101, 102, 103), uint64(100), prompt[16:], 16))), t0)
	if got := ix.Pressure([]string{"a", "b"}); got[0] != 3.0/7 || got[1] != 0 {
		t.Fatalf("3 of 7 stored again: %v", got)
	}
	// 10 s later the first 7 count half: with 4 new blocks, 1.5 of 7.5.
	ix.Apply("a", mustMessage(t, topicA, 4, batchPayload(t, vllmStored(anyHashes(200, 201, 202, 203), nil, seqTokens(500, 64), 16))),
		t0.Add(10*time.Second))
	if got := ix.Pressure([]string{"a"}); got[0] < 1.5/7.5-1e-9 || got[0] > 1.5/7.5+1e-9 {
		t.Fatalf("after a half-life: %v", got)
	}
}
