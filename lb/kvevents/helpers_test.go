package kvevents

import (
	"encoding/binary"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sluice-router/sluice/lb"
)

// Test payload builders: what engines put on the wire, encoded with the
// same msgpack library the publisher in llm-d-inference-sim uses.

func pack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// seqTokens returns n token ids starting at from.
func seqTokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func anyTokens(ts []uint32) []any {
	out := make([]any, len(ts))
	for i, v := range ts {
		out[i] = v
	}
	return out
}

func anyHashes(hs ...uint64) []any {
	out := make([]any, len(hs))
	for i, v := range hs {
		out[i] = v
	}
	return out
}

// vllmStored is vLLM's positional BlockStored (array_like, tag first).
func vllmStored(hashes []any, parent any, tokens []uint32, blockSize int) []any {
	return []any{"BlockStored", hashes, parent, anyTokens(tokens), blockSize, nil, "GPU"}
}

func vllmRemoved(hashes ...uint64) []any {
	return []any{"BlockRemoved", anyHashes(hashes...), "GPU"}
}

func batchPayload(t testing.TB, events ...any) []byte {
	return pack(t, []any{1.5, events, 0})
}

func frames(topic string, seq uint64, payload []byte) [][]byte {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	return [][]byte{[]byte(topic), s[:], payload}
}

func mustMessage(t testing.TB, topic string, seq uint64, payload []byte) Message {
	t.Helper()
	m, err := DecodeMessage(frames(topic, seq, payload), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// preq is a parsed completion request for text.
func preq(text string) *lb.Request { return &lb.Request{Model: "m", Text: text, Parsed: true} }
