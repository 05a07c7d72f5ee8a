package kvevents

import (
	"bytes"
	"errors"
	"testing"
)

func TestDecodeVLLMPositional(t *testing.T) {
	toks := seqTokens(100, 32)
	p := batchPayload(t,
		vllmStored(anyHashes(11, 12), nil, toks, 16),
		vllmRemoved(11),
		[]any{"AllBlocksCleared"},
	)
	m := mustMessage(t, "kv@10.0.0.1:8000@llama", 7, p)
	if m.Pod != "10.0.0.1:8000" || m.Model != "llama" || m.Seq != 7 {
		t.Fatalf("topic/seq: %+v", m)
	}
	evs := m.Batch.Events
	if len(evs) != 3 {
		t.Fatalf("events: %d", len(evs))
	}
	s := evs[0]
	if s.Kind != BlockStored || len(s.BlockHashes) != 2 || s.BlockHashes[0] != IntHash(11) ||
		s.Parent != NoHash || s.BlockSize != 16 || len(s.TokenIDs) != 32 || s.TokenIDs[31] != 131 ||
		s.Medium != "GPU" || s.HasLora {
		t.Fatalf("stored: %+v", s)
	}
	if evs[1].Kind != BlockRemoved || evs[1].BlockHashes[0] != IntHash(11) {
		t.Fatalf("removed: %+v", evs[1])
	}
	if evs[2].Kind != AllBlocksCleared {
		t.Fatalf("cleared: %+v", evs[2])
	}
}

// SGLang's structs are shorter (BlockStored ends at lora_id, BlockRemoved
// at block_hashes) and its batch has no rank; newer vLLM adds trailing fields.
func TestDecodeShortAndLongPositional(t *testing.T) {
	toks := seqTokens(0, 16)
	p := pack(t, []any{2.0, []any{
		[]any{"BlockStored", anyHashes(1), 9, anyTokens(toks), 16},
		[]any{"BlockStored", anyHashes(2), 1, anyTokens(toks), 16, 3},
		[]any{"BlockRemoved", anyHashes(1)},
		// vLLM with lora_name, extra_keys (nested), group_idx and later fields
		[]any{"BlockStored", anyHashes(3), nil, anyTokens(toks), 16, nil, "CPU", "adapter",
			[]any{[]any{"mm", []any{1, 2}}, nil}, 0, "full_attention", nil, "future"},
	}})
	b, err := DecodeBatch(p, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if b.hasDPRank || len(b.Events) != 4 {
		t.Fatalf("batch: %+v", b)
	}
	if b.Events[0].Parent != IntHash(9) || b.Events[0].Medium != "" {
		t.Fatalf("short stored: %+v", b.Events[0])
	}
	if !b.Events[1].HasLora || b.Events[1].LoraID != 3 {
		t.Fatalf("lora: %+v", b.Events[1])
	}
	if b.Events[3].Medium != "CPU" {
		t.Fatalf("long stored: %+v", b.Events[3])
	}
}

// Newer vLLM (no array_like) and the sim's map format name their fields.
func TestDecodeNamed(t *testing.T) {
	h := bytes.Repeat([]byte{0xab}, 32) // sha256-sized bytes hash
	p := pack(t, map[string]any{
		"ts": 3.25,
		"events": []any{
			map[string]any{"block_hashes": []any{h}, "type": "BlockStored", "parent_block_hash": nil,
				"token_ids": anyTokens(seqTokens(0, 16)), "block_size": 16, "medium": "GPU",
				"lora_name": nil, "group_idx": 0},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{h}},
			map[string]any{"type": "AllBlocksCleared"},
		},
		"data_parallel_rank": 2,
	})
	b, err := DecodeBatch(p, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if b.TS != 3.25 || b.DPRank != 2 || len(b.Events) != 3 {
		t.Fatalf("batch: %+v", b)
	}
	if b.Events[0].BlockHashes[0] != BlockHash("b"+string(h)) || b.Events[1].BlockHashes[0] != b.Events[0].BlockHashes[0] {
		t.Fatalf("bytes hash: %+v", b.Events)
	}
}

func TestDecodeHashForms(t *testing.T) {
	toks := seqTokens(0, 48)
	p := batchPayload(t, vllmStored([]any{int64(-5), uint64(1 << 63), []byte{1, 2, 3}}, int64(-7), toks, 16))
	b, err := DecodeBatch(p, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	hs := b.Events[0].BlockHashes
	if hs[0] != IntHash(uint64(1<<64-5)) || hs[1] != IntHash(1<<63) || hs[2] != "b\x01\x02\x03" {
		t.Fatalf("hashes: %q", hs)
	}
	if b.Events[0].Parent != IntHash(uint64(1<<64-7)) {
		t.Fatalf("parent: %q", b.Events[0].Parent)
	}
}

func TestDecodeUnknownEventSkipped(t *testing.T) {
	p := batchPayload(t, []any{"BlockPinned", anyHashes(1), map[string]any{"x": 1}}, vllmRemoved(4))
	b, err := DecodeBatch(p, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Unknown != 1 || len(b.Events) != 1 || b.Events[0].Kind != BlockRemoved {
		t.Fatalf("batch: %+v", b)
	}
}

func TestDecodeRejects(t *testing.T) {
	toks := seqTokens(0, 16)
	deep := any("x")
	for i := 0; i < 100; i++ {
		deep = []any{deep}
	}
	small := Limits{MaxEventsPerBatch: 2, MaxBlocksPerEvent: 2, MaxTokensPerEvent: 64, MaxPayloadBytes: 4096}
	cases := []struct {
		name    string
		payload []byte
		lim     Limits
		want    Reason
	}{
		{"not msgpack", []byte{0xc1}, Limits{}, ReasonMalformed},
		{"empty", nil, Limits{}, ReasonMalformed},
		{"scalar batch", pack(t, 5), Limits{}, ReasonMalformed},
		{"batch of one field", pack(t, []any{1.0}), Limits{}, ReasonMalformed},
		{"truncated", batchPayload(t, vllmStored(anyHashes(1), nil, toks, 16))[:20], Limits{}, ReasonMalformed},
		{"token count", batchPayload(t, vllmStored(anyHashes(1, 2), nil, toks, 16)), Limits{}, ReasonTokenCount},
		{"block size 0", batchPayload(t, vllmStored(anyHashes(), nil, nil, 0)), Limits{}, ReasonBlockSize},
		{"block size huge", batchPayload(t, vllmStored(anyHashes(1), nil, toks, 1<<20)), Limits{}, ReasonBlockSize},
		{"float hash", batchPayload(t, vllmStored([]any{1.5}, nil, toks, 16)), Limits{}, ReasonHash},
		{"empty bytes hash", batchPayload(t, []any{"BlockRemoved", []any{[]byte{}}}), Limits{}, ReasonHash},
		{"long bytes hash", batchPayload(t, []any{"BlockRemoved", []any{make([]byte, 65)}}), Limits{}, ReasonHash},
		{"negative token", batchPayload(t, []any{"BlockStored", anyHashes(1), nil, []any{-1}, 1}), Limits{}, ReasonMalformed},
		{"stored without tokens", batchPayload(t, []any{"BlockStored", anyHashes(1), nil}), Limits{}, ReasonMalformed},
		{"removed without hashes", batchPayload(t, []any{"BlockRemoved"}), Limits{}, ReasonMalformed},
		{"nil hashes", batchPayload(t, []any{"BlockRemoved", nil}), Limits{}, ReasonMalformed},
		{"event tag not string", batchPayload(t, []any{7, anyHashes(1)}), Limits{}, ReasonMalformed},
		{"event scalar", batchPayload(t, 7), Limits{}, ReasonMalformed},
		{"deep unknown field", batchPayload(t, []any{"BlockRemoved", anyHashes(1), "GPU", deep}), Limits{}, ReasonMalformed},
		{"too many events", batchPayload(t, vllmRemoved(1), vllmRemoved(2), vllmRemoved(3)), small, ReasonTooMany},
		{"too many blocks", batchPayload(t, vllmRemoved(1, 2, 3)), small, ReasonTooMany},
		{"too many tokens", batchPayload(t, vllmStored(anyHashes(1), nil, seqTokens(0, 65), 65)), small, ReasonTooMany},
		{"payload size", make([]byte, 4097), small, ReasonPayloadSize},
		{"rank out of range", pack(t, []any{1.0, []any{}, 1 << 20}), Limits{}, ReasonMalformed},
		{"token id over uint32", batchPayload(t, []any{"BlockStored", anyHashes(1), nil, []any{uint64(1 << 40)}, 1}), Limits{}, ReasonMalformed},
		{"map event ok", pack(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": anyHashes(1)}}}), Limits{}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeBatch(c.payload, c.lim)
			if c.want == "" {
				if err != nil {
					t.Fatalf("want ok, got %v", err)
				}
				return
			}
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != c.want {
				t.Fatalf("want reason %q, got %v", c.want, err)
			}
		})
	}
}

func TestDecodeMessageFrames(t *testing.T) {
	p := batchPayload(t, vllmRemoved(1))
	cases := []struct {
		name   string
		frames [][]byte
		want   Reason
	}{
		{"two frames", frames("kv@h:1@m", 1, p)[:2], ReasonFrames},
		{"four frames", append(frames("kv@h:1@m", 1, p), nil), ReasonFrames},
		{"short seq", [][]byte{[]byte("kv@h:1@m"), {1, 2}, p}, ReasonSeq},
		{"no prefix", frames("h:1@m", 1, p), ReasonTopic},
		{"wrong prefix", frames("xx@h:1@m", 1, p), ReasonTopic},
		{"no port", frames("kv@host@m", 1, p), ReasonTopic},
		{"port 0", frames("kv@host:0@m", 1, p), ReasonTopic},
		{"bad utf8", frames("kv@h:1@\xff", 1, p), ReasonTopic},
		{"long topic", frames("kv@h:1@"+string(bytes.Repeat([]byte("m"), 600)), 1, p), ReasonTopic},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeMessage(c.frames, Limits{})
			if ReasonOf(err) != c.want || err == nil {
				t.Fatalf("want %q, got %v", c.want, err)
			}
		})
	}
	m, err := DecodeMessage(frames("kv@[::1]:8000@org/model@v2", 9, p), Limits{})
	if err != nil || m.Pod != "[::1]:8000" || m.Model != "org/model@v2" {
		t.Fatalf("ipv6 pod, model with @: %+v %v", m, err)
	}
}

func TestParseListenAddr(t *testing.T) {
	good := map[string]string{
		"tcp://0.0.0.0:5557":   "0.0.0.0:5557",
		"tcp://*:5557":         ":5557",
		"tcp://127.0.0.1:5550": "127.0.0.1:5550",
		"tcp://[::1]:5550":     "[::1]:5550",
		"tcp://localhost:1":    "localhost:1",
	}
	for in, want := range good {
		got, err := ParseListenAddr(in)
		if err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0.0.0.0:5557", "ipc:///tmp/x", "udp://h:1", "tcp://:5557",
		"tcp://h", "tcp://h:0", "tcp://h:65536", "tcp://h:port", "tcp://a/b:1", "tcp://h:1/path"} {
		if _, err := ParseListenAddr(in); err == nil {
			t.Errorf("%q: want an error", in)
		}
	}
}
