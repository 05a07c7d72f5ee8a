package sim

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb/reqtext"
)

// chatWithImage is a chat request: a long system prompt, then a user
// message of an image and a question.
func chatWithImage(system, imageURL, question string) string {
	b, _ := json.Marshal(map[string]any{"max_tokens": 2, "messages": []any{
		map[string]any{"role": "system", "content": system},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": imageURL}},
			map[string]any{"type": "text", "text": question},
		}},
	}})
	return string(b)
}

// The same question about two images is two prompts: the replica must
// not report the second image's blocks (nor any after it) as cached. It
// rendered an image as nothing, so the two prompts were one.
func TestPrefixCacheTellsImagesApart(t *testing.T) {
	system := block("a shared system prompt ", 8*bc)
	question := block("what is in this picture? ", 6*bc)
	before := len("<|system|>\n" + system + "\n<|user|>\n") // the text the two share
	for _, c := range []struct{ name, a, b string }{
		{"url", "https://example.com/cat.png", "https://example.com/dog.png"},
		{"base64", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAf", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAg"},
	} {
		h := startSim(t, Config{PrefixCache: PrefixCache{Blocks: 256, BlockChars: bc}})
		h.cachedOf("/v1/chat/completions", chatWithImage(system, c.a, question))
		if _, hits := h.cachedOf("/v1/chat/completions", chatWithImage(system, c.b, question)); hits > uint64(before/bc) {
			t.Errorf("%s: another image hit %d blocks, want at most the %d before the image", c.name, hits, before/bc)
		}
		if _, hits := h.cachedOf("/v1/chat/completions", chatWithImage(system, c.a, question)); hits <= uint64(before/bc) {
			t.Errorf("%s: the same image again hit %d blocks, want more than the %d before it", c.name, hits, before/bc)
		}
	}
}

// The replica keys its cache on the router's rendering of the prompt
// (lb/reqtext), so the two agree on what is shared: media as digests,
// every text-like part, a message's tool calls and name, token ids apart
// from text.
func TestPrefixCacheRendersAsTheRouter(t *testing.T) {
	rp, err := New(Config{PrefixCache: PrefixCache{Blocks: 1 << 20, BlockChars: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"hello"}`},
		{"/v1/completions", `{"prompt":["a","b"]}`},
		{"/v1/completions", `{"prompt":[1,22,333]}`},
		{"/generate", `{"text":"hi there"}`},
		{"/generate", `{"input_ids":[[1,2],[3]]}`},
		{"/v1/chat/completions", chatWithImage("S", "https://example.com/cat.png", "q")},
		{"/v1/chat/completions", `{"messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"a"},` +
			`{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_audio","input_audio":{"data":"AAAA"}},` +
			`{"type":"output_text","text":"b"},{"type":"refusal","refusal":"no"},{"type":"thinking","thinking":"hmm"}]}]}`},
		{"/v1/chat/completions", `{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"1","name":"f","content":"42"}]}`},
	} {
		want, err := reqtext.Extract(c.path, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		req, _, err := rp.parseRequest(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(c.body)))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if w := newPromptPrefix([]byte(want.Text), 1, 1<<20); req.Prefix.textLen != len(want.Text) || !equalKeys(req.Prefix.keys, w.keys) {
			t.Errorf("%s %s: keyed on %d bytes, not on the router's %q", c.path, c.body, req.Prefix.textLen, want.Text)
		}
	}
}
