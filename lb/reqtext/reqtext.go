// Package reqtext extracts what routing and flow control need from an
// inference request body: the model, the prompt text (rendered so that
// requests sharing a prefix share a text prefix), streaming and the output
// token budget. One parser for every consumer, so they agree on the text.
package reqtext

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// Kinds of request, by path.
const (
	KindCompletions = "completions"
	KindChat        = "chat"
	KindGenerate    = "generate"
	KindOther       = "other"
)

// MaxTextBytes caps Text. Prefix routing only needs the beginning, and a
// huge prompt should not cost a huge tree insert; Truncated says it was cut.
const MaxTextBytes = 1 << 20

// Request is the parsed request.
type Request struct {
	Model     string
	Text      string
	Stream    bool
	MaxTokens int // 0: not given
	Kind      string
	Truncated bool // Text was cut at MaxTextBytes (on a rune boundary)
	// PromptTokens estimates the prompt's size: token ids are counted,
	// text at 4 bytes a token (the usual rule of thumb for BPE
	// vocabularies on English), the whole prompt even when Text was cut;
	// a chat's tool definitions and its messages' tool calls (see chat)
	// count as text of their JSON's size. Images and other media are not
	// weighed.
	PromptTokens int
	// Messages are a chat request's messages as the client sent them (raw
	// JSON, sub-slices of the body), so a tokenizer can hand them to the
	// engine, which applies its chat template; nil for other kinds. At
	// most the first MaxMessages (Text renders them all).
	Messages []json.RawMessage
	// TokenIDs: the prompt was given as token ids (Text is TokenIDsMark,
	// then them in decimal, space-separated; several prompts joined by
	// "\n").
	TokenIDs bool
	// CacheSalt is vLLM's cache_salt: the engine hashes it into the
	// request's first KV block, so no request with another salt (or none)
	// reuses its blocks. "" when absent or not a string.
	CacheSalt string
}

// Extract parses body according to path. Paths it does not know give Kind
// "other" and no error (the model is taken if the body is a JSON object
// that has one). For known paths, a body that is not JSON, or whose fields
// have the wrong shape, is an error: the caller then routes by load alone
// and forwards the body unchanged.
//
// A UTF-8 byte order mark before the body is skipped: vLLM and SGLang
// read the body with Python's json.loads on bytes, which skips it
// (utf-8-sig), and serve it.
func Extract(path string, body []byte) (Request, error) { return extract(path, body, true) }

// ExtractCounts is Extract without the prompt's text: Text is "" and
// Truncated false, every other field (PromptTokens and TokenIDs
// included) is what Extract gives, and so are its errors. For a caller
// that weighs a request without routing on its text (load_aware's
// defaults, flow_control's token mode): the text is the one copy of the
// prompt a parse makes, and the garbage it leaves grows with it.
func ExtractCounts(path string, body []byte) (Request, error) { return extract(path, body, false) }

// extract is Extract, rendering the text only withText.
func extract(path string, body []byte, withText bool) (Request, error) {
	body = bytes.TrimPrefix(body, byteOrderMark)
	switch kind := kindOf(path); kind {
	case KindChat:
		return chat(body, withText)
	case KindCompletions:
		return completions(body, withText)
	case KindGenerate:
		return generate(body, isStreamPath(path), withText)
	default:
		req := Request{Kind: KindOther}
		if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '{' {
			var model []byte
			s := &scanner{b: body}
			if s.top("body", func(key []byte) {
				if is(key, "model") {
					s.str(&model, "model")
				} else {
					s.skip(1)
				}
			}) == nil {
				req.Model = text(model)
			}
		}
		return req, nil
	}
}

var byteOrderMark = []byte("\xef\xbb\xbf")

// KindOf is the kind of request a path makes, whatever its body.
func KindOf(path string) string { return kindOf(path) }

// kindOf matches the path's end, so a prefix (e.g. /openai/v1/...) is fine.
// A generate path is SGLang's /generate, TGI's /generate and
// /generate_stream, or Triton's /v2/models/<model>[/versions/<v>]/generate
// and generate_stream.
func kindOf(path string) string {
	path = strings.TrimRight(path, "/")
	switch {
	case strings.HasSuffix(path, "/v1/chat/completions"):
		return KindChat
	case strings.HasSuffix(path, "/v1/completions"):
		return KindCompletions
	case strings.HasSuffix(path, "/generate") || isStreamPath(path):
		return KindGenerate
	}
	return KindOther
}

// isStreamPath: a generate path that always streams (TGI's and Triton's
// generate_stream).
func isStreamPath(path string) bool {
	return strings.HasSuffix(strings.TrimRight(path, "/"), "/generate_stream")
}

// is reports whether an object key names field: exactly, as the engines
// match it (see scanner).
func is(key []byte, field string) bool { return string(key) == field }

// shared reads a field every inference body has (model, stream) into
// req; false if key is another. The model is kept raw (model) and
// decoded once, after the last of a repeated key.
func (s *scanner) shared(key []byte, req *Request, model *[]byte) bool {
	switch {
	case is(key, "model"):
		s.str(model, "model")
	case is(key, "stream"):
		s.boolean(&req.Stream, "stream")
	case is(key, "cache_salt"):
		// Only read for routing: a body whose salt is not a string is
		// the engine's to refuse, not a reason to route it by load alone.
		req.CacheSalt = ""
		if s.peek() == '"' {
			if raw, escaped := s.rawString(); s.err == nil {
				req.CacheSalt = decode(raw, escaped)
			}
		} else {
			s.skip(1)
		}
	default:
		return false
	}
	return true
}

// MaxMessages bounds Request.Messages: a chat request's first messages
// are kept for a tokenizer (kvevents asks the engine for at most its
// first 1024), not millions of empty ones at a slice header each.
const MaxMessages = 4096

// chat renders messages as "<|role|>\ncontent\n" in order: the same
// conversation prefix gives the same text prefix. Content is a string, an
// array of parts, or null. Parts are joined by "\n": a text part (of the
// types vLLM renders as text) as its text, any other (an image, audio,
// video) as a marker "<|#digest|>" of the part, so the same question
// about two images is two prompts, and the same image one whatever its
// JSON's spacing. The fields of a message that the engine hands its chat
// template besides the content (metaFields: tool calls, a tool result's
// call id, reasoning, a name) add one marker after the content, and
// their size to PromptTokens, as the tool definitions (tools) do.
// Each message is rendered as its object ends, from the raw values of
// its last role, content and other fields: nothing is built per message.
func chat(body []byte, withText bool) (Request, error) {
	req := Request{Kind: KindChat}
	var model, tools []byte
	var maxCompletion int
	w := newWriter(len(body), withText)
	s := &scanner{b: body}
	err := s.top("chat completions body", func(key []byte) {
		switch {
		case s.shared(key, &req, &model):
		case is(key, "max_tokens"):
			s.integer(&req.MaxTokens, "max_tokens")
		case is(key, "max_completion_tokens"):
			s.integer(&maxCompletion, "max_completion_tokens")
		case is(key, "tools"):
			tools = s.raw(1)
		case is(key, "messages"):
			// The last messages key wins: what an earlier one rendered goes.
			w.reset()
			req.Messages = req.Messages[:0]
			switch s.peek() {
			case 'n':
				s.literal("null")
				req.Messages = nil
			case '[':
				s.array(2, func() {
					s.peek()
					start := s.i
					var m message
					if !s.isNull() {
						s.message(3, &m)
					}
					if s.err != nil {
						return
					}
					if len(req.Messages) < MaxMessages {
						req.Messages = append(req.Messages, json.RawMessage(s.b[start:s.i]))
					}
					w.str("<|")
					w.raw(m.role)
					w.str("|>\n")
					renderContent(w, m.content)
					renderMeta(w, &m.meta)
					w.str("\n")
				})
			default:
				s.typeErr("messages", "array")
			}
		default:
			s.skip(1)
		}
	})
	if err != nil {
		return Request{}, fmt.Errorf("chat completions body: %w", err)
	}
	req.Model = text(model)
	if maxCompletion > 0 {
		req.MaxTokens = maxCompletion // the newer name wins
	}
	if !isNull(tools) {
		w.weigh(len(tools))
	}
	w.done(&req)
	return req, nil
}

// metaFields are the fields of a chat message, besides role and content,
// that vLLM hands the chat template (chat_utils: an assistant's
// tool_calls and reasoning, a tool result's tool_call_id, a name), in the
// order their marker hashes them.
var metaFields = [...]string{"name", "tool_call_id", "reasoning", "reasoning_content", "tool_calls"}

const toolCalls = len(metaFields) - 1 // metaFields[toolCalls] == "tool_calls"

// message is one chat message's last role (a raw string), content (a raw
// string or array of parts) and metaFields (raw values); nil when null
// or absent.
type message struct {
	role, content []byte
	meta          [len(metaFields)][]byte
}

// message reads one chat message object, checking the types of the
// fields it renders.
func (s *scanner) message(depth int, m *message) {
	if s.peek() != '{' {
		s.typeErr("messages", "object")
		return
	}
	s.object(depth, func(key []byte) {
		switch {
		case is(key, "role"):
			s.str(&m.role, "role")
		case is(key, "content"):
			m.content = s.content(depth + 1)
		default:
			for k, f := range metaFields {
				if is(key, f) {
					m.meta[k] = nil
					if !s.isNull() {
						m.meta[k] = s.raw(depth)
					}
					return
				}
			}
			s.skip(depth)
		}
	})
}

// renderMeta writes the marker of a message's metaFields, and weighs
// them; nothing when none is given (an empty tool_calls is none, as vLLM
// drops it).
func renderMeta(w *writer, meta *[len(metaFields)][]byte) {
	n := 0
	for k, raw := range meta {
		if raw != nil && k == toolCalls && emptyArray(raw) {
			meta[k] = nil
		}
		n += len(meta[k])
	}
	if n == 0 {
		return
	}
	w.weigh(n)
	w.sep("\n")
	if w.cut {
		return // the text is full: no work for what is not kept
	}
	var d digester
	for k, raw := range meta {
		if raw != nil {
			d.str(metaFields[k])
			d.value(raw)
		}
	}
	w.marker(d.sum())
}

// emptyArray: raw (a valid value) is [].
func emptyArray(raw []byte) bool {
	return raw[0] == '[' && bytes.TrimLeft(raw[1:], " \t\r\n")[0] == ']'
}

// contentPart is one content part's type and raw text fields.
type contentPart struct{ typ, text, refusal, thinking []byte }

// part reads a content part object (the scanner is at its '{').
func (s *scanner) part(depth int, p *contentPart) {
	s.object(depth, func(key []byte) {
		switch {
		case is(key, "type"):
			s.str(&p.typ, "type")
		case is(key, "text"):
			s.str(&p.text, "text")
		case is(key, "refusal"):
			s.str(&p.refusal, "refusal")
		case is(key, "thinking"):
			s.str(&p.thinking, "thinking")
		default:
			s.skip(depth)
		}
	})
}

// textOf is the raw text a part renders as, if it is text to vLLM
// (chat_utils: text, input_text, output_text, refusal, thinking).
func (p *contentPart) textOf() ([]byte, bool) {
	switch {
	case p.typ == nil:
	case equals(p.typ, "text"), equals(p.typ, "input_text"), equals(p.typ, "output_text"):
		return p.text, true
	case equals(p.typ, "refusal"):
		return p.refusal, true
	case equals(p.typ, "thinking"):
		return p.thinking, true
	}
	return nil, false
}

// content checks a message's content: a string, an array of parts
// (objects whose type and text fields are strings), or null (nil).
func (s *scanner) content(depth int) []byte {
	s.peek()
	start := s.i
	switch s.peek() {
	case 'n':
		s.literal("null")
		return nil
	case '"':
		s.rawString()
	case '[':
		s.array(depth, func() {
			if s.isNull() {
				return
			}
			if s.peek() != '{' {
				s.typeErr("content", "object")
				return
			}
			var p contentPart
			s.part(depth+1, &p)
		})
	default:
		s.skip(depth)
		if s.err == nil {
			s.fail(errors.New("content: want a string or an array of parts"))
		}
	}
	if s.err != nil {
		return nil
	}
	return s.b[start:s.i]
}

// renderContent writes a content content() checked: a string's text, or
// its parts' (see chat), joined by "\n".
func renderContent(w *writer, raw []byte) {
	switch {
	case raw == nil:
	case raw[0] == '"':
		w.raw(raw)
	default:
		s := &scanner{b: raw}
		first := true
		s.array(0, func() {
			if s.isNull() {
				return
			}
			start := s.i
			var p contentPart
			s.part(0, &p)
			if !first {
				w.str("\n")
			}
			first = false
			if txt, ok := p.textOf(); ok {
				w.raw(txt)
			} else if !w.cut { // else the text is full: no work for what is not kept
				var d digester
				d.value(s.b[start:s.i])
				w.marker(d.sum())
			}
		})
	}
}

// completions renders the prompt (see promptText).
func completions(body []byte, withText bool) (Request, error) {
	req := Request{Kind: KindCompletions}
	var model, prompt []byte
	s := &scanner{b: body}
	err := s.top("completions body", func(key []byte) {
		switch {
		case s.shared(key, &req, &model):
		case is(key, "max_tokens"):
			s.integer(&req.MaxTokens, "max_tokens")
		case is(key, "prompt"):
			prompt = s.raw(1)
		default:
			s.skip(1)
		}
	})
	if err != nil {
		return Request{}, fmt.Errorf("completions body: %w", err)
	}
	req.Model = text(model)
	w := newWriter(len(body), withText)
	if err := promptText(w, prompt); err != nil {
		return Request{}, fmt.Errorf("prompt: %w", err)
	}
	w.done(&req)
	return req, nil
}

// generate reads the three bodies a generate path takes, by the field
// that holds the prompt: SGLang's (text, or else input_ids; output bound
// sampling_params.max_new_tokens), else TGI's (inputs;
// parameters.max_new_tokens), else Triton's generate extension's
// (text_input; max_tokens, or parameters.max_tokens). TGI's and Triton's
// fields are checked only in their own body: SGLang ignores them. A
// generate_stream path (stream) streams whatever the body says.
func generate(body []byte, stream, withText bool) (Request, error) {
	req := Request{Kind: KindGenerate}
	var model, txt, ids, inputs, textInput, params, maxTokens []byte
	s := &scanner{b: body}
	err := s.top("generate body", func(key []byte) {
		switch {
		case s.shared(key, &req, &model):
		case is(key, "text"):
			txt = s.raw(1)
		case is(key, "input_ids"):
			ids = s.raw(1)
		case is(key, "inputs"):
			inputs = s.raw(1)
		case is(key, "text_input"):
			textInput = s.raw(1)
		case is(key, "parameters"):
			params = s.raw(1)
		case is(key, "max_tokens"):
			maxTokens = s.raw(1)
		case is(key, "sampling_params"):
			req.MaxTokens = 0 // the last sampling_params wins
			switch s.peek() {
			case 'n':
				s.literal("null")
			case '{':
				s.object(2, func(key []byte) {
					if is(key, "max_new_tokens") {
						s.integer(&req.MaxTokens, "max_new_tokens")
					} else {
						s.skip(2)
					}
				})
			default:
				s.typeErr("sampling_params", "object")
			}
		default:
			s.skip(1)
		}
	})
	if err != nil {
		return Request{}, fmt.Errorf("generate body: %w", err)
	}
	req.Model = text(model)
	req.Stream = req.Stream || stream
	field, raw := "text", txt
	switch {
	case !isNull(txt):
	case !isNull(ids) || isNull(inputs) && isNull(textInput):
		field, raw = "input_ids", ids
	case !isNull(inputs): // TGI
		field, raw = "inputs", inputs
		req.MaxTokens = 0
		if err := paramInt(params, "max_new_tokens", &req.MaxTokens); err != nil {
			return Request{}, fmt.Errorf("parameters: %w", err)
		}
	default: // Triton
		field, raw = "text_input", textInput
		req.MaxTokens = 0
		if err := paramInt(params, "max_tokens", &req.MaxTokens); err != nil {
			return Request{}, fmt.Errorf("parameters: %w", err)
		}
		if !isNull(maxTokens) {
			s := &scanner{b: maxTokens}
			if s.integer(&req.MaxTokens, "max_tokens"); s.err != nil {
				return Request{}, s.err
			}
		}
	}
	w := newWriter(len(body), withText)
	if err := promptText(w, raw); err != nil {
		return Request{}, fmt.Errorf("%s: %w", field, err)
	}
	w.done(&req)
	return req, nil
}

// paramInt reads the int field of a raw (valid) JSON object into dst
// (null: 0); an absent or null object, or no such field, leaves dst as it
// is.
func paramInt(raw []byte, field string, dst *int) error {
	s := &scanner{b: raw}
	switch s.peek() {
	case 0, 'n':
		return nil
	case '{':
		s.object(0, func(key []byte) {
			if is(key, field) {
				s.integer(dst, field)
			} else {
				s.skip(0)
			}
		})
	default:
		s.typeErr("parameters", "object")
	}
	return s.err
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) == 0 || raw[0] == 'n'
}

// promptText renders a polymorphic prompt (valid JSON: the scanner checked
// it): a string; an array of strings (joined by "\n"; null elements are
// empty, as encoding/json makes them); an array of token ids (decimal,
// space-separated, so prompts sharing leading ids share a text prefix;
// done puts TokenIDsMark in front);
// or an array of such arrays (joined by "\n"). Absent or null renders as
// "". Strings are decoded straight into w: no allocation per element.
func promptText(w *writer, raw json.RawMessage) error {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] == 'n' {
		return nil
	}
	if raw[0] == '"' {
		w.raw(raw)
		return nil
	}
	if raw[0] != '[' {
		return errors.New("want a string, an array of strings or an array of token ids")
	}
	// The first element decides the shape.
	first := bytes.TrimLeft(raw[1:], " \t\r\n")
	switch {
	case len(first) == 0 || first[0] == ']':
		return nil
	case first[0] == '"':
		s := &scanner{b: raw}
		i := 0
		s.array(0, func() {
			if i > 0 {
				w.str("\n")
			}
			i++
			switch s.peek() {
			case '"':
				raw, _ := s.rawString()
				w.raw(raw)
			case 'n':
				s.literal("null")
			default:
				s.skip(0)
				s.fail(errors.New("json: cannot unmarshal into a prompt string"))
			}
		})
		return s.err
	default:
		return writeIDs(w, raw)
	}
}

// writeIDs renders an array of token ids, or an array of arrays of them,
// copying each id's digits as they are (JSON allows no leading zeros, so
// equal ids have equal digits; -0 is written 0). raw is a valid JSON array (the caller's
// scanner checked it); this only checks the shape and that every
// number is an integer. Scanning by hand is ~10x faster than decoding
// into []int64 and allocates nothing.
func writeIDs(w *writer, raw []byte) error {
	depth, nested, wrote := 0, false, false
	for i := 0; i < len(raw); {
		switch c := raw[i]; {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',':
			i++
		case c == '[':
			depth++
			if depth == 2 {
				if !nested && wrote {
					return errors.New("mixed token ids and arrays")
				}
				if nested {
					w.sep("\n")
				}
				nested, wrote = true, false
			} else if depth > 2 {
				return errors.New("token id arrays nest at most two deep")
			}
			i++
		case c == ']':
			depth--
			i++
		case c == '-' || (c >= '0' && c <= '9'):
			if nested && depth == 1 {
				return errors.New("mixed token ids and arrays")
			}
			j := i + 1
			for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
				j++
			}
			if j < len(raw) && (raw[j] == '.' || raw[j] == 'e' || raw[j] == 'E') {
				return fmt.Errorf("token id %s...: not an integer", raw[i:j])
			}
			if wrote {
				w.sep(" ")
			}
			if id := raw[i:j]; string(id) == "-0" {
				w.id(id[1:]) // the engine's int: 0
			} else {
				w.id(id)
			}
			wrote = true
			i = j
		default:
			return errors.New("want token ids (integers)")
		}
	}
	return nil
}

// writer builds Text up to MaxTextBytes, and counts what it was given.
// A counting writer (ExtractCounts) only counts: it is given the same
// pieces, so its counts are the same.
type writer struct {
	b         []byte
	counting  bool
	cut       bool
	textBytes int // text given (cut or not)
	ids       int // token ids given
}

func newWriter(hint int, withText bool) *writer {
	if !withText {
		return &writer{counting: true}
	}
	return &writer{b: make([]byte, 0, min(hint, MaxTextBytes))}
}

// sep appends a separator of Sluice's rendering (not counted as text).
func (w *writer) sep(s string) {
	n := w.textBytes
	w.str(s)
	w.textBytes = n
}

// str appends text.
func (w *writer) str(s string) { appendText(w, s) }

// raw appends a validated raw string's value (see unquoter).
func (w *writer) raw(raw []byte) {
	if raw == nil {
		return
	}
	u := unquoter{in: raw[1 : len(raw)-1]}
	for p := u.next(); p != nil; p = u.next() {
		w.bytes(p)
	}
}

// bytes appends text (not retained).
func (w *writer) bytes(b []byte) { appendText(w, b) }

// appendText appends s to w's text up to MaxTextBytes, cut on a rune
// boundary so Text stays valid UTF-8; textBytes counts it all.
func appendText[T string | []byte](w *writer, s T) {
	w.textBytes += len(s)
	if w.cut || w.counting {
		return
	}
	if room := MaxTextBytes - len(w.b); len(s) > room {
		for room > 0 && !utf8.RuneStart(s[room]) {
			room--
		}
		s, w.cut = s[:room], true
	}
	w.b = append(w.b, s...)
}

// marker appends "<|#" and sum in hex and "|>": something of the prompt
// that is not text (not counted as text).
func (w *writer) marker(sum uint64) {
	var b [len("<|#0123456789abcdef|>")]byte
	copy(b[:], "<|#")
	const hex = "0123456789abcdef"
	for i := range 16 {
		b[3+i] = hex[sum>>(60-4*i)&0xf]
	}
	copy(b[19:], "|>")
	n := w.textBytes
	w.bytes(b[:])
	w.textBytes = n
}

// weigh counts n bytes of prompt that are not in the text.
func (w *writer) weigh(n int) { w.textBytes += n }

// reset empties w (a repeated key: the last one's value is the text).
func (w *writer) reset() { *w = writer{b: w.b[:0], counting: w.counting} }

// id appends one token id's digits (ASCII: any cut is a rune boundary).
func (w *writer) id(b []byte) {
	w.ids++
	if w.cut || w.counting {
		return
	}
	if room := MaxTextBytes - len(w.b); len(b) > room {
		b, w.cut = b[:room], true
	}
	w.b = append(w.b, b...)
}

// done fills the request's Text, Truncated, TokenIDs and PromptTokens,
// marking a prompt of token ids (see TokenIDsMark).
func (w *writer) done(req *Request) {
	req.TokenIDs = w.ids > 0 && w.textBytes == 0
	req.PromptTokens = w.ids + (w.textBytes+3)/4
	switch {
	case w.counting:
	case req.TokenIDs:
		req.Text, req.Truncated = marked(TokenIDsMark, w.b, w.cut)
	case startsWithMark(w.b):
		req.Text, req.Truncated = marked(markEscape, w.b, w.cut)
	case cap(w.b) > 2*len(w.b):
		// Mostly JSON around short strings: a copy, so that what the
		// text keeps alive (queued by cache_aware's sharer, say) stays
		// about its own size.
		req.Text, req.Truncated = string(w.b), w.cut
	default:
		// The text shares the writer's bytes, as strings.Builder's
		// String does: nothing writes them after done (each parse has
		// its own writer, and done is its last use). A copy cost a second
		// allocation of the prompt's size on every parse.
		req.Text, req.Truncated = unsafe.String(unsafe.SliceData(w.b), len(w.b)), w.cut
	}
}
