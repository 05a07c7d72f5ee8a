package reqtext

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func mustExtract(t *testing.T, path, body string) Request {
	t.Helper()
	req, err := Extract(path, []byte(body))
	if err != nil {
		t.Fatalf("Extract(%s, %s): %v", path, body, err)
	}
	return req
}

func TestChat(t *testing.T) {
	req := mustExtract(t, "/v1/chat/completions", `{
		"model": "llama", "stream": true, "max_tokens": 64,
		"messages": [
			{"role": "system", "content": "Be brief."},
			{"role": "user", "content": [
				{"type": "text", "text": "What is in"},
				{"type": "image_url", "image_url": {"url": "data:..."}},
				{"type": "text", "text": "this picture?"}
			]},
			{"role": "assistant", "content": null, "tool_calls": []},
			{"role": "user", "content": "Thanks\n\u00e9"}
		]}`)
	want := Request{
		Model: "llama", Stream: true, MaxTokens: 64, Kind: KindChat,
		Text: "<|system|>\nBe brief.\n<|user|>\nWhat is in\n" + markerOf(`{"type": "image_url", "image_url": {"url": "data:..."}}`) +
			"\nthis picture?\n<|assistant|>\n\n<|user|>\nThanks\né\n",
		PromptTokens: 23, // 89 bytes of text at 4 a token, rounded up (the image's marker is not text)
	}
	// The messages as sent, for an engine's /tokenize.
	wantMsgs := []string{`{"role": "system", "content": "Be brief."}`, `{"role": "assistant", "content": null, "tool_calls": []}`}
	if len(req.Messages) != 4 || string(req.Messages[0]) != wantMsgs[0] || string(req.Messages[2]) != wantMsgs[1] {
		t.Fatalf("messages: %q", req.Messages)
	}
	req.Messages = nil
	if !reflect.DeepEqual(req, want) {
		t.Fatalf("got  %#v\nwant %#v", req, want)
	}
	// max_completion_tokens, the newer name, wins over max_tokens.
	req = mustExtract(t, "/v1/chat/completions", `{"max_tokens": 5, "max_completion_tokens": 9, "messages": []}`)
	if req.MaxTokens != 9 || req.Text != "" {
		t.Fatalf("got %#v", req)
	}
}

// Two chats with the same system prompt share a text prefix that covers
// the whole system message, so the tree routes them together.
func TestChatSharedSystemPromptSharesPrefix(t *testing.T) {
	sys := "You are a pirate. Answer in rhymes."
	a := mustExtract(t, "/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, sys))
	b := mustExtract(t, "/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"system","content":[{"type":"text","text":%q}]},{"role":"user","content":"bye"}]}`, sys))
	n := 0
	for n < len(a.Text) && n < len(b.Text) && a.Text[n] == b.Text[n] {
		n++
	}
	if prefix := "<|system|>\n" + sys + "\n<|user|>\n"; n < len(prefix) || a.Text[:len(prefix)] != prefix {
		t.Fatalf("shared prefix %q, want at least %q", a.Text[:n], prefix)
	}
	// Rendering is stable: same body, same text.
	if c := mustExtract(t, "/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":"hi"}]}`, sys)); c.Text != a.Text {
		t.Fatalf("unstable rendering")
	}
}

func TestCompletions(t *testing.T) {
	for _, c := range []struct {
		body, text string
	}{
		{`{"prompt": "Once upon"}`, "Once upon"},
		{`{"prompt": ["a", "b c"]}`, "a\nb c"},
		{`{"prompt": [1, 22, 333]}`, TokenIDsMark + "1 22 333"},
		{`{"prompt": [[1, 2], [1, 3]]}`, TokenIDsMark + "1 2\n1 3"},
		{`{"prompt": []}`, ""},
		{`{"prompt": [-3, 0]}`, TokenIDsMark + "-3 0"},
		{`{"prompt": [[], [7]]}`, TokenIDsMark + "\n7"},
		{`{"prompt": "esc\n\u00e9\"q"}`, "esc\né\"q"},
		{`{}`, ""},
	} {
		req := mustExtract(t, "/v1/completions", c.body)
		if req.Text != c.text || req.Kind != KindCompletions {
			t.Errorf("%s: got %#v, want text %q", c.body, req, c.text)
		}
	}
	req := mustExtract(t, "/openai/v1/completions/", `{"model":"m","stream":true,"max_tokens":7,"prompt":"x"}`)
	if !reflect.DeepEqual(req, Request{Model: "m", Stream: true, MaxTokens: 7, Kind: KindCompletions, Text: "x", PromptTokens: 1}) {
		t.Fatalf("got %#v", req)
	}
}

func TestGenerate(t *testing.T) {
	for _, c := range []struct {
		body, text string
	}{
		{`{"text": "What is the capital of France?"}`, "What is the capital of France?"},
		{`{"text": ["one", "two"]}`, "one\ntwo"},
		{`{"input_ids": [101, 2054, 2003]}`, TokenIDsMark + "101 2054 2003"},
		{`{"input_ids": [[101, 7], [101, 8]]}`, TokenIDsMark + "101 7\n101 8"},
		{`{"text": null, "input_ids": [5]}`, TokenIDsMark + "5"},
	} {
		req := mustExtract(t, "/generate", c.body)
		if req.Text != c.text || req.Kind != KindGenerate {
			t.Errorf("%s: got %#v, want text %q", c.body, req, c.text)
		}
	}
	req := mustExtract(t, "/generate", `{"model":"m","stream":true,"text":"x","sampling_params":{"max_new_tokens":12,"temperature":0}}`)
	if !reflect.DeepEqual(req, Request{Model: "m", Stream: true, MaxTokens: 12, Kind: KindGenerate, Text: "x", PromptTokens: 1}) {
		t.Fatalf("got %#v", req)
	}
	// Shared leading ids give a shared text prefix.
	a := mustExtract(t, "/generate", `{"input_ids": [1, 2, 3, 4]}`)
	b := mustExtract(t, "/generate", `{"input_ids": [1, 2, 3, 99]}`)
	if !strings.HasPrefix(a.Text, TokenIDsMark+"1 2 3 ") || !strings.HasPrefix(b.Text, TokenIDsMark+"1 2 3 ") {
		t.Fatalf("id prefixes: %q, %q", a.Text, b.Text)
	}
}

func TestBadBodies(t *testing.T) {
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages": [`},
		{"/v1/chat/completions", `not json`},
		{"/v1/chat/completions", ``},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": 5}]}`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}`},
		{"/v1/completions", `{"prompt": 5}`},
		{"/v1/completions", `{"prompt": [1, "a"]}`},
		{"/v1/completions", `{"prompt": [1.5]}`},
		{"/generate", `{"text": {"a": 1}}`},
		{"/generate", `{"input_ids": [[1], 2]}`},
		{"/generate", `{"input_ids": [1, [2]]}`},
		{"/generate", `{"input_ids": [[1, [2]]]}`},
		{"/generate", `{"input_ids": [[1, "2"]]}`},
	} {
		if req, err := Extract(c.path, []byte(c.body)); err == nil {
			t.Errorf("%s %s: no error, got %#v", c.path, c.body, req)
		}
	}
}

func TestOtherPaths(t *testing.T) {
	for _, c := range []struct{ path, body, model string }{
		{"/v1/embeddings", `{"model": "e5", "input": "x"}`, "e5"},
		{"/health", ``, ""},
		{"/upload", "\x00\x01 binary", ""},
		{"/v1/models", `[1,2]`, ""},
	} {
		req, err := Extract(c.path, []byte(c.body))
		if err != nil || req.Kind != KindOther || req.Model != c.model || req.Text != "" {
			t.Errorf("%s: got %#v, %v", c.path, req, err)
		}
	}
}

func TestPromptTokensEstimate(t *testing.T) {
	for _, c := range []struct {
		path, body string
		want       int
	}{
		{"/v1/completions", `{"prompt": "` + strings.Repeat("abcd", 100) + `"}`, 100},
		{"/v1/completions", `{"prompt": "abcde"}`, 2},
		{"/v1/completions", `{"prompt": [1, 22, 333]}`, 3}, // ids are counted, not their digits
		{"/v1/completions", `{"prompt": [[1, 2], [1, 3, 4]]}`, 5},
		{"/generate", `{"input_ids": [101, 2054, 2003]}`, 3},
		{"/v1/completions", `{"prompt": []}`, 0},
		{"/v1/completions", `{}`, 0},
	} {
		if got := mustExtract(t, c.path, c.body).PromptTokens; got != c.want {
			t.Errorf("%s: prompt tokens %d, want %d", c.body, got, c.want)
		}
	}
	// A prompt over the text cap is still estimated whole.
	body, _ := json.Marshal(map[string]string{"prompt": strings.Repeat("abcd", MaxTextBytes/2)})
	if req := mustExtract(t, "/v1/completions", string(body)); !req.Truncated || req.PromptTokens != MaxTextBytes/2 {
		t.Fatalf("truncated=%v tokens=%d, want %d", req.Truncated, req.PromptTokens, MaxTextBytes/2)
	}
}

func TestTruncatedOnRuneBoundary(t *testing.T) {
	long := strings.Repeat("日", MaxTextBytes) // 3 bytes each: over the cap
	body, _ := json.Marshal(map[string]string{"prompt": long})
	req := mustExtract(t, "/v1/completions", string(body))
	if !req.Truncated || len(req.Text) > MaxTextBytes || !utf8.ValidString(req.Text) || len(req.Text) < MaxTextBytes-3 {
		t.Fatalf("truncated=%v len=%d valid=%v", req.Truncated, len(req.Text), utf8.ValidString(req.Text))
	}
	if req := mustExtract(t, "/v1/completions", `{"prompt":"short"}`); req.Truncated {
		t.Fatalf("short prompt marked truncated")
	}
}

// chatBody4KB is a typical request: a ~1.5 KB system prompt, a few turns.
func chatBody4KB() []byte {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You are a helpful assistant. ", 55)}}
	for i := 0; i < 6; i++ {
		msgs = append(msgs, map[string]string{"role": []string{"user", "assistant"}[i%2], "content": strings.Repeat(fmt.Sprintf("turn %d says something. ", i), 16)})
	}
	b, _ := json.Marshal(map[string]any{"model": "llama-3-8b", "stream": true, "max_tokens": 256, "messages": msgs})
	return b
}

func BenchmarkExtractChat4KB(b *testing.B) {
	body := chatBody4KB()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Extract("/v1/chat/completions", body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExtractCountsChat4KB(b *testing.B) {
	body := chatBody4KB()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ExtractCounts("/v1/chat/completions", body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkExtractTokenIDs(b *testing.B) {
	ids := make([]int, 1000)
	for i := range ids {
		ids[i] = 1000 + i*7
	}
	body, _ := json.Marshal(map[string]any{"input_ids": ids})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Extract("/generate", body); err != nil {
			b.Fatal(err)
		}
	}
}

// completionsBody4KB: a 4 KB prompt and the usual sampling fields.
func completionsBody4KB() []byte {
	b, _ := json.Marshal(map[string]any{"model": "llama-3-8b", "max_tokens": 256, "temperature": 0.7, "top_p": 1,
		"stop": []string{"\n\n"}, "prompt": strings.Repeat("Summarise the following report. ", 128)})
	return b
}

func BenchmarkExtractCompletions4KB(b *testing.B) {
	body := completionsBody4KB()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Extract("/v1/completions", body); err != nil {
			b.Fatal(err)
		}
	}
}

func TestDeepNestingIsRefusedCheaply(t *testing.T) {
	deep := `{"messages":[` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `]}`
	if _, err := Extract("/v1/chat/completions", []byte(deep)); err == nil {
		t.Fatal("a body nested 5000 deep was accepted")
	}
	ok := `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`
	if _, err := Extract("/v1/chat/completions", []byte(ok)); err != nil {
		t.Fatalf("a normal chat body: %v", err)
	}
}

// Token-id prompts say so: their Text is the ids, not words.
func TestTokenIDs(t *testing.T) {
	for _, c := range []struct {
		path, body string
		ids        bool
	}{
		{"/v1/completions", `{"prompt": [1, 22, 333]}`, true},
		{"/v1/completions", `{"prompt": [[1, 2], [1, 3]]}`, true},
		{"/v1/completions", `{"prompt": "1 22 333"}`, false},
		{"/v1/completions", `{"prompt": []}`, false},
		{"/generate", `{"input_ids": [101, 7]}`, true},
		{"/generate", `{"text": "x", "input_ids": [5]}`, false},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "1 2"}]}`, false},
	} {
		if req := mustExtract(t, c.path, c.body); req.TokenIDs != c.ids {
			t.Errorf("%s %s: TokenIDs %v, want %v", c.path, c.body, req.TokenIDs, c.ids)
		}
	}
}

// markerOf is the marker a content part renders as.
func markerOf(part string) string {
	var d digester
	d.value([]byte(part))
	return refMarker(d.sum())
}

// ExtractCounts weighs a prompt past MaxTextBytes as Extract does (the
// whole of it), with no text to cut.
func TestCountsWeighWhatExtractCuts(t *testing.T) {
	body := []byte(`{"prompt":"` + strings.Repeat("é", MaxTextBytes) + `","max_tokens":3}`)
	full, err := Extract("/v1/completions", body)
	if err != nil || !full.Truncated {
		t.Fatalf("Extract: %v, truncated %t", err, full.Truncated)
	}
	counts, err := ExtractCounts("/v1/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	if counts.Text != "" || counts.Truncated || counts.PromptTokens != full.PromptTokens || counts.MaxTokens != 3 {
		t.Fatalf("counts %d tokens, text %d bytes, truncated %t; Extract %d tokens",
			counts.PromptTokens, len(counts.Text), counts.Truncated, full.PromptTokens)
	}
}
