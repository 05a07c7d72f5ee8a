package kvevents

import (
	"fmt"
	"testing"
)

// BenchmarkPrefixesLookup is the per-request cost kv_events adds to a pick:
// tokenize a ~4 KB prompt (the sim's rule), key it, match 4 replicas.
func BenchmarkPrefixesLookup(b *testing.B) {
	ix := NewIndex(Config{})
	text := prompt("word", 700) // ~4.4 KB, 700 tokens
	toks, _ := SimTokenizer{}.Tokenize("m", text)
	addrs := make([]string, 4)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.0.%d:8000", i)
		n := (len(toks) / 16 / (i + 1)) * 16
		b.Logf("replica %d holds %d tokens", i, n)
		topic := "kv@" + addrs[i] + "@m"
		hs := make([]uint64, n/16)
		for j := range hs {
			hs[j] = uint64(j + 1)
		}
		ix.Apply(addrs[i], mustMessage(b, topic, 1, batchPayload(b, vllmStored(anyHashes(hs...), nil, toks[:n], 16))), t0)
	}
	px := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}, SpeculateFor: -1}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		px.Lookup(preq(text), addrs)
	}
}

func BenchmarkSimTokenizer(b *testing.B) {
	text := prompt("word", 700)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		SimTokenizer{}.Tokenize("m", text)
	}
}

// BenchmarkEngineTokenizerWarm is the engine tokenizer's cost on the pick
// for the same ~4.4 KB prompt once its whole text is cached: hash its 18
// cuts, find the longest cached, mark them seen (no request: nothing to
// ask).
func BenchmarkEngineTokenizerWarm(b *testing.B) {
	text := prompt("word", 700)
	toks, _ := SimTokenizer{}.Tokenize("m", text)
	e := NewEngineTokenizer(EngineConfig{})
	defer e.Close()
	p := Prompt{Model: "m", Text: text, Replicas: []string{"10.0.0.1:8000"}}
	cs := e.cuts(p)
	e.mu.Lock()
	e.put(&tokEntry{key: cs[len(cs)-1].key, tokens: toks})
	e.mu.Unlock()
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, ok := e.TokenizePrompt(p); !ok {
			b.Fatal("miss")
		}
	}
}
