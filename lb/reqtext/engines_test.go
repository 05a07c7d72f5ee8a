package reqtext

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Bodies the engines read as different prompts must not give Sluice the
// same text (the tree would send them all where one of them is cached as
// if the whole prompt were), and bodies they read as the same prompt
// should give the same text.

func chatText(t *testing.T, body string) string {
	t.Helper()
	return mustExtract(t, "/v1/chat/completions", body).Text
}

// vLLM (chat_utils: MM_PARSER_MAP) renders the parts of type input_text
// and output_text (their "text"), refusal (its "refusal") and thinking
// (its "thinking") as text, like "text" ones.
func TestTextPartsOfEveryTypeTheEngineRenders(t *testing.T) {
	for _, c := range []struct{ part, text string }{
		{`{"type":"input_text","text":"alpha"}`, "alpha"},
		{`{"type":"output_text","text":"alpha"}`, "alpha"},
		{`{"type":"refusal","refusal":"alpha"}`, "alpha"},
		{`{"type":"thinking","thinking":"alpha"}`, "alpha"},
	} {
		got := chatText(t, `{"messages":[{"role":"assistant","content":[{"type":"text","text":"x"},`+c.part+`]}]}`)
		if want := "<|assistant|>\nx\n" + c.text + "\n"; got != want {
			t.Errorf("%s: text %q, want %q", c.part, got, want)
		}
	}
}

// An image (audio, video, any part that is not text) is part of the
// prompt: the same question about two images is two prompts, which share
// their text only up to the image. The same image, however its JSON is
// spaced or escaped, is the same prompt.
func TestMediaPartsAreThePrompt(t *testing.T) {
	body := func(url string) string {
		return `{"messages":[{"role":"user","content":[{"type":"text","text":"Describe"},` +
			`{"type":"image_url","image_url":{"url":"` + url + `"}},{"type":"text","text":"this picture in detail, please."}]}]}`
	}
	a, b := chatText(t, body("data:image/png;base64,AAAA")), chatText(t, body("data:image/png;base64,BBBB"))
	if a == b {
		t.Fatalf("two images, one text: %q", a)
	}
	if prefix := "<|user|>\nDescribe\n"; !strings.HasPrefix(a, prefix) || !strings.HasPrefix(b, prefix) {
		t.Fatalf("the text before the image is not shared: %q, %q", a, b)
	}
	if strings.Contains(a, "AAAA") {
		t.Fatalf("the image's bytes are in the text: %q", a)
	}
	for _, same := range []string{
		"{ \"messages\" : [ { \"role\" : \"user\" , \"content\" : [ {\"type\":\"text\",\"text\":\"Describe\"} ,\n\t" +
			`{ "type" : "image_url" , "image_url" : { "url" : "data:image\/png;base64,\u0041AAA" } } , {"type":"text","text":"this picture in detail, please."}]}]}`,
	} {
		if got := chatText(t, same); got != a {
			t.Errorf("the same image spaced and escaped otherwise: %q, want %q", got, a)
		}
	}
	// A text-only array still renders as the same text given as a string.
	if got, want := chatText(t, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`),
		chatText(t, `{"messages":[{"role":"user","content":"a\nb"}]}`); got != want {
		t.Errorf("text parts %q, string %q", got, want)
	}
	// Other kinds of media, and parts without a type, count too.
	for _, parts := range [][2]string{
		{`{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}`, `{"type":"input_audio","input_audio":{"data":"BBBB","format":"wav"}}`},
		{`{"type":"video_url","video_url":{"url":"http://x/1.mp4"}}`, `{"type":"video_url","video_url":{"url":"http://x/2.mp4"}}`},
		{`{"image_url":{"url":"http://x/1.png"}}`, `{"image_url":{"url":"http://x/2.png"}}`},
		{`{"type":"image_url","image_url":{"url":"http://x/1.png"},"uuid":"1"}`, `{"type":"image_url","image_url":{"url":"http://x/1.png"},"uuid":"2"}`},
	} {
		a := chatText(t, `{"messages":[{"role":"user","content":[`+parts[0]+`,{"type":"text","text":"What is it?"}]}]}`)
		b := chatText(t, `{"messages":[{"role":"user","content":[`+parts[1]+`,{"type":"text","text":"What is it?"}]}]}`)
		if a == b {
			t.Errorf("%s and %s: one text %q", parts[0], parts[1], a)
		}
	}
}

// The fields of a message that vLLM hands its chat template besides the
// content (an assistant's tool_calls and reasoning, a tool result's
// tool_call_id, a name) are the prompt: two agents that called different
// tools are different prompts from there on. Their size is weighed.
func TestMessageFieldsTheTemplateRendersArePrompt(t *testing.T) {
	conv := func(assistant string) string {
		return `{"messages":[{"role":"user","content":"Fix the bug."},` + assistant +
			`,{"role":"tool","tool_call_id":"call_1","content":"done"},{"role":"user","content":"Thanks, and now the next one please."}]}`
	}
	call := func(args string) string {
		return `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"edit","arguments":` + quote(args) + `}}]}`
	}
	a, b := chatText(t, conv(call(`{"file":"a.go"}`))), chatText(t, conv(call(`{"file":"b.go"}`)))
	if a == b {
		t.Fatalf("different tool calls, one text: %q", a)
	}
	if prefix := "<|user|>\nFix the bug.\n<|assistant|>\n"; !strings.HasPrefix(b, prefix) {
		t.Fatalf("the conversation before the call is not shared: %q", b)
	}
	spaced := strings.ReplaceAll(conv(call(`{"file":"a.go"}`)), `"tool_calls":[{`, "\"tool_calls\" : [ {\n")
	if got := chatText(t, spaced); got != a {
		t.Errorf("the same call spaced otherwise: %q, want %q", got, a)
	}
	for _, other := range []string{
		`{"role":"assistant","content":null,"reasoning_content":"think b","tool_calls":[]}`,
		`{"role":"assistant","content":null,"reasoning":"think b","tool_calls":[]}`,
		`{"role":"assistant","name":"bob","content":null,"tool_calls":[]}`,
	} {
		base := `{"role":"assistant","content":null,"tool_calls":[]}`
		if chatText(t, conv(other)) == chatText(t, conv(base)) {
			t.Errorf("%s: the same text as %s", other, base)
		}
	}
	if chatText(t, strings.Replace(conv(call("{}")), `"tool_call_id":"call_1"`, `"tool_call_id":"call_2"`, 1)) == chatText(t, conv(call("{}"))) {
		t.Errorf("tool results of two calls: one text")
	}
	// A call's arguments are prompt the engine reads: a 40 KB file written
	// by a tool call weighs its size.
	big := chatBodyTokens(t, conv(call(`{"content":`+quote(strings.Repeat("code ", 8000))+`}`)))
	if big < 10000 {
		t.Errorf("a 40 KB tool call weighs %d tokens", big)
	}
	// Absent, null and empty are the same message.
	for _, m := range []string{
		`{"role":"assistant","content":"ok","tool_calls":null,"name":null}`,
		`{"role":"assistant","content":"ok"}`,
	} {
		if got, want := chatText(t, `{"messages":[`+m+`]}`), "<|assistant|>\nok\n"; got != want {
			t.Errorf("%s: %q, want %q", m, got, want)
		}
	}
}

func chatBodyTokens(t *testing.T, body string) int {
	t.Helper()
	return mustExtract(t, "/v1/chat/completions", body).PromptTokens
}

// The tool definitions are rendered into the prompt by the chat template
// (thousands of tokens for an agent's tools): they are weighed.
func TestToolDefinitionsAreWeighed(t *testing.T) {
	tools := `[{"type":"function","function":{"name":"edit","description":` + quote(strings.Repeat("Edits a file. ", 3000)) + `}}]`
	body := `{"tools":` + tools + `,"messages":[{"role":"user","content":"hi"}],"tools":` + tools + `}`
	if got := chatBodyTokens(t, body); got < 10000 {
		t.Errorf("42 KB of tools weigh %d tokens", got)
	}
	if got := chatBodyTokens(t, `{"tools":`+tools+`,"messages":[{"role":"user","content":"hi"}],"tools":null}`); got != 3 {
		t.Errorf("tools given, then null: %d tokens, want 3 (the messages')", got)
	}
}

// /generate is also TGI's (inputs, parameters.max_new_tokens) and
// Triton's generate extension's (/v2/models/<m>/generate: text_input,
// max_tokens); /generate_stream is both servers' streaming form. Read as
// SGLang's, their prompt was empty: a 100k-token prompt routed on no
// prefix and weighed 0 tokens.
func TestGenerateDialects(t *testing.T) {
	long := strings.Repeat("lorem ipsum ", 1000)
	for _, c := range []struct {
		name, path, body string
		want             Request
	}{
		{"tgi", "/generate", `{"inputs":` + quote(long) + `,"parameters":{"max_new_tokens":20,"temperature":0.5}}`,
			Request{Kind: KindGenerate, Text: long, MaxTokens: 20}},
		{"tgi stream", "/generate_stream", `{"inputs":"hi","parameters":{"max_new_tokens":7}}`,
			Request{Kind: KindGenerate, Text: "hi", MaxTokens: 7, Stream: true}},
		{"tgi no parameters", "/generate", `{"inputs":"hi","parameters":null}`,
			Request{Kind: KindGenerate, Text: "hi"}},
		{"triton", "/v2/models/llama/generate", `{"text_input":` + quote(long) + `,"max_tokens":20,"bad_words":"","stop_words":""}`,
			Request{Kind: KindGenerate, Text: long, MaxTokens: 20}},
		{"triton parameters", "/v2/models/llama/versions/1/generate_stream", `{"text_input":"hi","parameters":{"max_tokens":9,"stream":true}}`,
			Request{Kind: KindGenerate, Text: "hi", MaxTokens: 9, Stream: true}},
		{"sglang first", "/generate", `{"text":"a","inputs":"b","text_input":"c","parameters":"not read","max_tokens":"nor this","sampling_params":{"max_new_tokens":3}}`,
			Request{Kind: KindGenerate, Text: "a", MaxTokens: 3}},
		{"sglang ids first", "/generate", `{"input_ids":[1],"inputs":"b"}`,
			Request{Kind: KindGenerate, Text: TokenIDsMark + "1", TokenIDs: true}},
	} {
		got, err := Extract(c.path, []byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if c.want.PromptTokens = (len(c.want.Text) + 3) / 4; c.want.TokenIDs {
			c.want.PromptTokens = 1
		}
		if got.Text != c.want.Text || got.MaxTokens != c.want.MaxTokens || got.Stream != c.want.Stream ||
			got.Kind != c.want.Kind || got.PromptTokens != c.want.PromptTokens || got.TokenIDs != c.want.TokenIDs {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, short(got), short(c.want))
		}
	}
	for _, c := range []struct{ path, body string }{
		{"/generate", `{"inputs":5}`},
		{"/generate", `{"inputs":"a","parameters":{"max_new_tokens":"x"}}`},
		{"/generate", `{"inputs":"a","parameters":[]}`},
		{"/v2/models/m/generate", `{"text_input":"a","max_tokens":1.5}`},
	} {
		if req, err := Extract(c.path, []byte(c.body)); err == nil {
			t.Errorf("%s %s: no error, got %+v", c.path, c.body, short(req))
		}
	}
}

func short(r Request) Request {
	if len(r.Text) > 40 {
		r.Text = r.Text[:40] + "..."
	}
	return r
}

// -0 is token id 0 to the engine (an int): the same prompt as 0.
func TestNegativeZeroTokenIDIsZero(t *testing.T) {
	a := mustExtract(t, "/v1/completions", `{"prompt":[-0,5]}`)
	b := mustExtract(t, "/v1/completions", `{"prompt":[0,5]}`)
	if a.Text != b.Text || a.Text != TokenIDsMark+"0 5" {
		t.Fatalf("[-0,5]: %q, [0,5]: %q", a.Text, b.Text)
	}
}

// vLLM and SGLang read the body with Python's json.loads on bytes, which
// skips a UTF-8 byte order mark (utf-8-sig): a body that starts with one
// is served, so it is read.
func TestByteOrderMarkIsSkipped(t *testing.T) {
	for _, c := range []struct{ path, body, text string }{
		{"/v1/chat/completions", "\xef\xbb\xbf" + `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "<|user|>\nhi\n"},
		{"/v1/completions", "\xef\xbb\xbf" + ` {"model":"m","prompt":"hi"}`, "hi"},
		{"/generate", "\xef\xbb\xbf" + `{"model":"m","text":"hi"}`, "hi"},
		{"/v1/embeddings", "\xef\xbb\xbf" + `{"model":"m","input":"hi"}`, ""},
	} {
		req, err := Extract(c.path, []byte(c.body))
		if err != nil || req.Model != "m" || req.Text != c.text {
			t.Errorf("%s: %+v, %v", c.path, req, err)
		}
	}
	// Only at the start, and only once.
	for _, body := range []string{`{"prompt":"hi"}` + "\xef\xbb\xbf", "\xef\xbb\xbf\xef\xbb\xbf" + `{"prompt":"hi"}`, ` ` + "\xef\xbb\xbf" + `{"prompt":"hi"}`} {
		if _, err := Extract("/v1/completions", []byte(body)); err == nil {
			t.Errorf("%q: no error", body)
		}
	}
}

// The digest of a part or of a message's fields (its marker) is taken in
// one pass over the raw value; it must be the digest of the value's
// tokens as encoding/json reads them, whatever the spacing.
func FuzzDigestMatchesEncodingJSON(f *testing.F) {
	for _, seed := range []string{
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"auto"}}`,
		`[{"id":"1","function":{"name":"f","arguments":"{\"a\":1}"}}]`,
		`{"a":[1,-2.5e+3,0.0,true,false,null,"\ud83d\ude00\u00e9\/\n"],"":{}}`, "\"bad \xff\xed\xa0\x80\"", `-0`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) || nestingDepth(raw) > maxDepth {
			return
		}
		s := &scanner{b: raw}
		v := s.raw(0)
		if s.end() != nil {
			t.Fatalf("%q: %v", raw, s.err)
		}
		var got, want digester
		got.value(v)
		if err := refDigest(&want, raw); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if got.sum() != want.sum() {
			t.Fatalf("%q: digest %x, encoding/json's tokens %x", raw, got.sum(), want.sum())
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, raw); err != nil {
			t.Fatal(err)
		}
		var c digester
		c.value(compact.Bytes())
		if c.sum() != got.sum() {
			t.Fatalf("%q: spacing changed the digest", raw)
		}
	})
}
