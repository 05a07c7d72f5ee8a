package reqtext

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"unicode/utf8"
)

// The decoder Extract used before its single-pass scanner: encoding/json
// into structs. Kept as the reference the scanner is fuzzed against
// (FuzzExtractMatchesEncodingJSON).

// refExtract is Extract with the encoding/json decoders.
func refExtract(path string, body []byte) (Request, error) {
	switch kindOf(path) {
	case KindChat:
		return refChat(body)
	case KindCompletions:
		return refCompletions(body)
	case KindGenerate:
		return refGenerate(body)
	}
	return Extract(path, body)
}

type refChatBody struct {
	Model               string `json:"model"`
	Stream              bool   `json:"stream"`
	MaxTokens           int    `json:"max_tokens"`
	MaxCompletionTokens int    `json:"max_completion_tokens"`
	Messages            []struct {
		Role    string     `json:"role"`
		Content refContent `json:"content"`
	} `json:"messages"`
}

type refPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// refContent is a message's refContent: a string, an array of parts (only the
// text ones are kept), or null.
type refContent struct{ texts []string }

func (c *refContent) UnmarshalJSON(b []byte) error {
	switch b[0] { // json hands over one valid, trimmed value
	case 'n':
		return nil
	case '"':
		s, err := refUnquote(b)
		if err != nil {
			return err
		}
		c.texts = append(c.texts[:0], s)
		return nil
	case '[':
		var parts []refPart
		if err := json.Unmarshal(b, &parts); err != nil {
			return err
		}
		c.texts = c.texts[:0]
		for _, p := range parts {
			if p.Type == "text" {
				c.texts = append(c.texts, p.Text)
			}
		}
		return nil
	}
	return errors.New("refContent: want a string or an array of parts")
}

// chat renders messages as "<|role|>\ncontent\n" in order: the same
// system prompt gives the same leading text whatever follows. Text parts
// of an array refContent are joined by "\n"; other parts (images, audio) are
// skipped, so a text-only array renders like the same text as a string.
func refChat(body []byte) (Request, error) {
	var v refChatBody
	if err := json.Unmarshal(body, &v); err != nil {
		return Request{}, fmt.Errorf("chat completions body: %w", err)
	}
	req := Request{Kind: KindChat, Model: v.Model, Stream: v.Stream, MaxTokens: v.MaxTokens}
	if v.MaxCompletionTokens > 0 {
		req.MaxTokens = v.MaxCompletionTokens // the newer name wins
	}
	w := newWriter(len(body))
	for _, m := range v.Messages {
		w.str("<|")
		w.str(m.Role)
		w.str("|>\n")
		for j, t := range m.Content.texts {
			if j > 0 {
				w.str("\n")
			}
			w.str(t)
		}
		w.str("\n")
	}
	w.done(&req)
	return req, nil
}

type refCompletionsBody struct {
	Model     string          `json:"model"`
	Stream    bool            `json:"stream"`
	MaxTokens int             `json:"max_tokens"`
	Prompt    json.RawMessage `json:"prompt"`
}

func refCompletions(body []byte) (Request, error) {
	var v refCompletionsBody
	if err := json.Unmarshal(body, &v); err != nil {
		return Request{}, fmt.Errorf("completions body: %w", err)
	}
	req := Request{Kind: KindCompletions, Model: v.Model, Stream: v.Stream, MaxTokens: v.MaxTokens}
	w := newWriter(len(body))
	if err := refPromptText(w, v.Prompt); err != nil {
		return Request{}, fmt.Errorf("prompt: %w", err)
	}
	w.done(&req)
	return req, nil
}

type refGenerateBody struct {
	Model          string          `json:"model"`
	Stream         bool            `json:"stream"`
	Text           json.RawMessage `json:"text"`
	InputIDs       json.RawMessage `json:"input_ids"`
	SamplingParams struct {
		MaxNewTokens int `json:"max_new_tokens"`
	} `json:"sampling_params"`
}

// generate handles SGLang's native /generate: text, or else input_ids.
func refGenerate(body []byte) (Request, error) {
	var v refGenerateBody
	if err := json.Unmarshal(body, &v); err != nil {
		return Request{}, fmt.Errorf("generate body: %w", err)
	}
	req := Request{Kind: KindGenerate, Model: v.Model, Stream: v.Stream, MaxTokens: v.SamplingParams.MaxNewTokens}
	w := newWriter(len(body))
	field, raw := "text", v.Text
	if isNull(raw) {
		field, raw = "input_ids", v.InputIDs
	}
	if err := refPromptText(w, raw); err != nil {
		return Request{}, fmt.Errorf("%s: %w", field, err)
	}
	w.done(&req)
	return req, nil
}

// refPromptText is promptText with encoding/json decoding the strings.
func refPromptText(w *writer, raw json.RawMessage) error {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] == 'n' {
		return nil
	}
	if raw[0] == '"' {
		s, err := refUnquote(raw)
		w.str(s)
		return err
	}
	if raw[0] != '[' {
		return errors.New("want a string, an array of strings or an array of token ids")
	}
	first := bytes.TrimLeft(raw[1:], " \t\r\n")
	switch {
	case len(first) == 0 || first[0] == ']':
		return nil
	case first[0] == '"':
		var ss []string
		if err := json.Unmarshal(raw, &ss); err != nil {
			return err
		}
		for i, s := range ss {
			if i > 0 {
				w.str("\n")
			}
			w.str(s)
		}
		return nil
	}
	return writeIDs(w, raw)
}

// refUnquote is the string decoder the old code used.
func refUnquote(b []byte) (string, error) {
	if in := b[1 : len(b)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return string(in), nil
	}
	var s string
	err := json.Unmarshal(b, &s)
	return s, err
}

// fieldNames are the keys Extract reads, at any level.
var fieldNames = []string{"model", "stream", "max_tokens", "max_completion_tokens", "messages", "role",
	"content", "type", "text", "prompt", "input_ids", "sampling_params", "max_new_tokens"}

// differsByDesign reports whether any object in the valid JSON body has a
// key twice (matched as encoding/json matches them), or a key that
// encoding/json takes for a field and Extract does not (another case: the
// engines match names exactly), where the two decoders differ by design.
func differsByDesign(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		obj  bool
		keys [][]byte
		next bool // in an object: the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.next {
			if k, ok := tok.(string); ok {
				for _, f := range fieldNames {
					if k != f && bytes.EqualFold([]byte(k), []byte(f)) {
						return true
					}
				}
				for _, seen := range top.keys {
					if bytes.EqualFold(seen, []byte(k)) {
						return true
					}
				}
				top.keys = append(top.keys, []byte(k))
				top.next = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, next: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: in an object, a key comes next.
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].next = true
		}
	}
}

// The single-pass scanner must agree with encoding/json on every body:
// the same error/no error, and on success the same request.
func FuzzExtractMatchesEncodingJSON(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"image_url"},null]},null]}`,
		`{"Model":"x","MAX_TOKENS":-3,"max_completion_tokens":7,"messages":null}`,
		`{"prompt":"once upon","max_tokens":1e2}`,
		`{"prompt":[[1,2],[3]],"stream":null}`,
		`{"text":null,"input_ids":[5,6],"sampling_params":{"max_new_tokens":12}}`,
		`{"messages":[{"content":"\u00e9\ud83d\ude00\"q"}]}`,
		`{"messages":[{"content":5}]}`,
		`null`, `[]`, `{"a":[{"b":[1,2.5e-3,true,false,null,"x"]}]}  `, `{"a":1,}`, `{"model":"\xff"}`,
		`{"prompt":["\ud800","a\u0000",null,"\ud83d\ude00\ud83d"],"m\u006fdel":"\u00e9\/"}`,
		`{"messages":[{"content":[{"type":"t\u0065xt","text":"\ud83d\ude00"},{"type":"text","text":null}],"role":"\t"}]}`,
		"{\"text\":\"bad \xff\xed\xa0\x80 utf-8\",\"sampling_params\":null}",
	} {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/generate"} {
			f.Add(path, []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		switch kindOf(path) {
		case KindChat, KindCompletions, KindGenerate:
		default:
			return
		}
		want, werr := refExtract(path, body)
		got, gerr := Extract(path, body)
		if nestingDepth(body) > maxDepth {
			if gerr == nil {
				t.Fatalf("%s: a body nested past %d levels was accepted", path, maxDepth)
			}
			return // refused on purpose, where encoding/json goes to 10000
		}
		if differsByDesign(body) {
			// A key given twice, or in another case: the engines' reading,
			// not encoding/json's (scanner); only validity is shared.
			if gerr == nil && !json.Valid(body) {
				t.Fatalf("%s %q: invalid JSON accepted", path, body)
			}
			return
		}
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%s %q: encoding/json err %v, scanner err %v", path, body, werr, gerr)
		}
		if len(got.Messages) > MaxMessages {
			t.Fatalf("%s: %d messages kept", path, len(got.Messages))
		}
		for _, m := range got.Messages {
			if !json.Valid(m) {
				t.Fatalf("%s %q: message %q is not JSON", path, body, m)
			}
		}
		got.Messages = nil
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%s %q:\nencoding/json %#v\nscanner       %#v", path, body, want, got)
		}
	})
}

// The encoding/json decoder on the same bodies, for the ratio.
func BenchmarkRefExtractChat4KB(b *testing.B) {
	body := chatBody4KB()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := refExtract("/v1/chat/completions", body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRefExtractCompletions4KB(b *testing.B) {
	body := completionsBody4KB()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := refExtract("/v1/completions", body); err != nil {
			b.Fatal(err)
		}
	}
}

// nestingDepth is the deepest [ or { nesting of body, outside strings.
func nestingDepth(body []byte) int {
	depth, deepest, inString, escaped := 0, 0, false, false
	for _, c := range body {
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString:
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}
