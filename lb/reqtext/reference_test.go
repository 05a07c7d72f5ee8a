package reqtext

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"
	"unicode/utf8"
)

// The decoder Extract used before its single-pass scanner: encoding/json
// into structs. Kept as the reference the scanner is fuzzed against
// (FuzzExtractMatchesEncodingJSON).

// refExtract is Extract with the encoding/json decoders.
func refExtract(path string, body []byte) (Request, error) {
	body = bytes.TrimPrefix(body, byteOrderMark) // as the engines do (Extract)
	switch kindOf(path) {
	case KindChat:
		return refChat(body)
	case KindCompletions:
		return refCompletions(body)
	case KindGenerate:
		return refGenerate(body, isStreamPath(path))
	}
	return Extract(path, body)
}

type refChatBody struct {
	Model               string          `json:"model"`
	Stream              bool            `json:"stream"`
	MaxTokens           int             `json:"max_tokens"`
	MaxCompletionTokens int             `json:"max_completion_tokens"`
	Tools               json.RawMessage `json:"tools"`
	Messages            []struct {
		Role    string     `json:"role"`
		Content refContent `json:"content"`
		// metaFields, in their order.
		Name             json.RawMessage `json:"name"`
		ToolCallID       json.RawMessage `json:"tool_call_id"`
		Reasoning        json.RawMessage `json:"reasoning"`
		ReasoningContent json.RawMessage `json:"reasoning_content"`
		ToolCalls        json.RawMessage `json:"tool_calls"`
	} `json:"messages"`
}

type refPart struct {
	Type     *string `json:"type"`
	Text     string  `json:"text"`
	Refusal  string  `json:"refusal"`
	Thinking string  `json:"thinking"`
}

// refContent is a message's content: a string, an array of parts (text,
// or a marker of the part), or null.
type refContent struct{ parts []refRendered }

type refRendered struct {
	text   string
	marker bool // text is a part's digest
}

func (c *refContent) UnmarshalJSON(b []byte) error {
	switch b[0] { // json hands over one valid, trimmed value
	case 'n':
		return nil
	case '"':
		s, err := refUnquote(b)
		if err != nil {
			return err
		}
		c.parts = append(c.parts[:0], refRendered{text: s})
		return nil
	case '[':
		var raws []json.RawMessage
		if err := json.Unmarshal(b, &raws); err != nil {
			return err
		}
		c.parts = c.parts[:0]
		for _, raw := range raws {
			if isNull(raw) {
				continue
			}
			var p refPart
			if err := json.Unmarshal(raw, &p); err != nil {
				return err
			}
			switch t := p.Type; {
			case t != nil && (*t == "text" || *t == "input_text" || *t == "output_text"):
				c.parts = append(c.parts, refRendered{text: p.Text})
			case t != nil && *t == "refusal":
				c.parts = append(c.parts, refRendered{text: p.Refusal})
			case t != nil && *t == "thinking":
				c.parts = append(c.parts, refRendered{text: p.Thinking})
			default:
				var d digester
				if err := refDigest(&d, raw); err != nil {
					return err
				}
				c.parts = append(c.parts, refRendered{text: refMarker(d.sum()), marker: true})
			}
		}
		return nil
	}
	return errors.New("refContent: want a string or an array of parts")
}

// refDigest hashes a JSON value's tokens as encoding/json's decoder reads
// them (the digester's tagging, for its own single pass to match).
func refDigest(d *digester, raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch tok := tok.(type) {
		case json.Delim:
			d.byte(byte(tok))
		case string:
			d.str(tok)
		case json.Number:
			d.byte('#')
			d.write([]byte(tok))
			d.byte('#')
		case bool:
			if tok {
				d.byte('t')
			} else {
				d.byte('f')
			}
		case nil:
			d.byte('z')
		}
	}
}

func refMarker(sum uint64) string { return fmt.Sprintf("<|#%016x|>", sum) }

// chat renders messages as "<|role|>\ncontent\n" in order: the same
// system prompt gives the same leading text whatever follows. The parts
// of an array content are joined by "\n", the text ones as their text,
// the others (images, audio) as a marker; so a text-only array renders
// like the same text as a string. The message's other fields the
// template renders add a marker, and they and the tools are weighed.
func refChat(body []byte) (Request, error) {
	var v refChatBody
	if err := json.Unmarshal(body, &v); err != nil {
		return Request{}, fmt.Errorf("chat completions body: %w", err)
	}
	req := Request{Kind: KindChat, Model: v.Model, Stream: v.Stream, MaxTokens: v.MaxTokens}
	if v.MaxCompletionTokens > 0 {
		req.MaxTokens = v.MaxCompletionTokens // the newer name wins
	}
	w := newWriter(len(body), true)
	for _, m := range v.Messages {
		w.str("<|")
		w.str(m.Role)
		w.str("|>\n")
		for j, p := range m.Content.parts {
			if j > 0 {
				w.str("\n")
			}
			if p.marker {
				n := w.textBytes
				w.str(p.text)
				w.textBytes = n
			} else {
				w.str(p.text)
			}
		}
		var d digester
		n := 0
		for k, raw := range []json.RawMessage{m.Name, m.ToolCallID, m.Reasoning, m.ReasoningContent, m.ToolCalls} {
			if isNull(raw) {
				continue
			}
			if metaFields[k] == "tool_calls" {
				var calls []json.RawMessage
				if json.Unmarshal(raw, &calls) == nil && len(calls) == 0 {
					continue
				}
			}
			d.str(metaFields[k])
			if err := refDigest(&d, raw); err != nil {
				return Request{}, err
			}
			n += len(raw)
		}
		if n > 0 {
			w.sep("\n" + refMarker(d.sum()))
			w.textBytes += n
		}
		w.str("\n")
	}
	if !isNull(v.Tools) {
		w.textBytes += len(v.Tools)
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
	w := newWriter(len(body), true)
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
	Inputs     json.RawMessage `json:"inputs"`     // TGI
	TextInput  json.RawMessage `json:"text_input"` // Triton
	Parameters json.RawMessage `json:"parameters"`
	MaxTokens  json.RawMessage `json:"max_tokens"`
}

// generate handles SGLang's native /generate (text, or else input_ids),
// TGI's (inputs) and Triton's (text_input).
func refGenerate(body []byte, stream bool) (Request, error) {
	var v refGenerateBody
	if err := json.Unmarshal(body, &v); err != nil {
		return Request{}, fmt.Errorf("generate body: %w", err)
	}
	req := Request{Kind: KindGenerate, Model: v.Model, Stream: v.Stream || stream, MaxTokens: v.SamplingParams.MaxNewTokens}
	w := newWriter(len(body), true)
	field, raw := "text", v.Text
	switch {
	case !isNull(v.Text):
	case !isNull(v.InputIDs) || isNull(v.Inputs) && isNull(v.TextInput):
		field, raw = "input_ids", v.InputIDs
	case !isNull(v.Inputs):
		field, raw = "inputs", v.Inputs
		var p struct {
			MaxNewTokens int `json:"max_new_tokens"`
		}
		if len(v.Parameters) > 0 {
			if err := json.Unmarshal(v.Parameters, &p); err != nil {
				return Request{}, err
			}
		}
		req.MaxTokens = p.MaxNewTokens
	default:
		field, raw = "text_input", v.TextInput
		var p struct {
			MaxTokens int `json:"max_tokens"`
		}
		if len(v.Parameters) > 0 {
			if err := json.Unmarshal(v.Parameters, &p); err != nil {
				return Request{}, err
			}
		}
		if !isNull(v.MaxTokens) {
			if err := json.Unmarshal(v.MaxTokens, &p.MaxTokens); err != nil {
				return Request{}, err
			}
		}
		req.MaxTokens = p.MaxTokens
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
	"content", "type", "text", "prompt", "input_ids", "sampling_params", "max_new_tokens",
	"inputs", "text_input", "parameters", "refusal", "thinking", "tools", "name", "tool_call_id", "reasoning",
	"reasoning_content", "tool_calls"}

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
		`{"inputs":"tgi","parameters":{"max_new_tokens":5,"max_tokens":2},"sampling_params":{"max_new_tokens":3}}`,
		`{"text_input":["triton"],"max_tokens":null,"parameters":{"max_tokens":4}}`,
		`{"text":null,"inputs":null,"text_input":"t","parameters":[],"max_tokens":7}`,
		`{"tools":[{"type":"function"}],"messages":[{"role":"assistant","content":[{"type":"refusal","refusal":"no"},` +
			`{"type":"image_url","image_url":{"url":"data:,A\/\u00e9"},"n":[-1.5e3,true,false,null]},{"image_url":"x"},` +
			`{"type":"thinking","thinking":"t"},{"type":"output_text","text":"o"}],"tool_calls":[{"id":"1"}],"name":"a","reasoning":null},` +
			`{"role":"tool","tool_call_id":"1","tool_calls":[ ],"content":"r"}]}`,
	} {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/generate", "/generate_stream"} {
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
		// ExtractCounts is Extract without the text, on every body: the
		// same error or none, the same counts.
		counts, cerr := ExtractCounts(path, body)
		if (cerr == nil) != (gerr == nil) {
			t.Fatalf("%s: ExtractCounts error %v, Extract error %v", path, cerr, gerr)
		}
		if gerr == nil {
			textless := got
			textless.Text, textless.Truncated = "", false
			if !reflect.DeepEqual(counts, textless) {
				t.Fatalf("%s: ExtractCounts\n %+v\nExtract without its text\n %+v", path, counts, textless)
			}
		}
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
