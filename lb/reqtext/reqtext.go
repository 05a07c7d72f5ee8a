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
	// vocabularies on English), the whole prompt even when Text was cut.
	PromptTokens int
	// Messages are a chat request's messages as the client sent them (raw
	// JSON, sub-slices of the body), so a tokenizer can hand them to the
	// engine, which applies its chat template; nil for other kinds.
	Messages []json.RawMessage
	// TokenIDs: the prompt was given as token ids (Text is them in
	// decimal, space-separated; several prompts joined by "\n").
	TokenIDs bool
}

// Extract parses body according to path. Paths it does not know give Kind
// "other" and no error (the model is taken if the body is a JSON object
// that has one). For known paths, a body that is not JSON, or whose fields
// have the wrong shape, is an error: the caller then routes by load alone
// and forwards the body unchanged.
func Extract(path string, body []byte) (Request, error) {
	switch kind := kindOf(path); kind {
	case KindChat:
		return chat(body)
	case KindCompletions:
		return completions(body)
	case KindGenerate:
		return generate(body)
	default:
		req := Request{Kind: KindOther}
		var v struct {
			Model string `json:"model"`
		}
		if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '{' && json.Unmarshal(body, &v) == nil {
			req.Model = v.Model
		}
		return req, nil
	}
}

// kindOf matches the path's end, so a prefix (e.g. /openai/v1/...) is fine.
func kindOf(path string) string {
	path = strings.TrimRight(path, "/")
	switch {
	case strings.HasSuffix(path, "/v1/chat/completions"):
		return KindChat
	case strings.HasSuffix(path, "/v1/completions"):
		return KindCompletions
	case path == "/generate" || strings.HasSuffix(path, "/generate"):
		return KindGenerate
	}
	return KindOther
}

// is reports whether an object key names field (encoding/json's matching).
func is(key []byte, field string) bool { return bytes.EqualFold(key, []byte(field)) }

// shared reads a field every inference body has (model, stream) into
// req; false if key is another.
func (s *scanner) shared(key []byte, req *Request) bool {
	switch {
	case is(key, "model"):
		s.str(&req.Model, "model")
	case is(key, "stream"):
		s.boolean(&req.Stream, "stream")
	default:
		return false
	}
	return true
}

// chat renders messages as "<|role|>\ncontent\n" in order: the same
// conversation prefix gives the same text prefix. Content is a string, an
// array of parts (only the text ones count, joined by "\n"), or null.
func chat(body []byte) (Request, error) {
	req := Request{Kind: KindChat}
	var maxCompletion int
	type message struct {
		role  string
		texts []string
	}
	var msgs []message
	s := &scanner{b: body}
	err := s.top("chat completions body", func(key []byte) {
		switch {
		case s.shared(key, &req):
		case is(key, "max_tokens"):
			s.integer(&req.MaxTokens, "max_tokens")
		case is(key, "max_completion_tokens"):
			s.integer(&maxCompletion, "max_completion_tokens")
		case is(key, "messages"):
			switch s.peek() {
			case 'n':
				s.literal("null")
				msgs = nil
			case '[':
				msgs = msgs[:0]
				req.Messages = req.Messages[:0]
				s.array(2, func() {
					var m message
					s.peek()
					start := s.i
					if !s.isNull() {
						s.message(3, &m.role, &m.texts)
					}
					if s.err == nil {
						req.Messages = append(req.Messages, json.RawMessage(s.b[start:s.i]))
					}
					msgs = append(msgs, m)
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
	if maxCompletion > 0 {
		req.MaxTokens = maxCompletion // the newer name wins
	}
	w := newWriter(len(body))
	for _, m := range msgs {
		w.str("<|")
		w.str(m.role)
		w.str("|>\n")
		for j, t := range m.texts {
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

// message reads one chat message object into role and texts.
func (s *scanner) message(depth int, role *string, texts *[]string) {
	if s.peek() != '{' {
		s.typeErr("messages", "object")
		return
	}
	s.object(depth, func(key []byte) {
		switch {
		case is(key, "role"):
			s.str(role, "role")
		case is(key, "content"):
			s.content(depth+1, texts)
		default:
			s.skip(depth)
		}
	})
}

// content reads a message's content: a string (its text), an array of
// parts (the text of those of type "text"), or null (no change).
func (s *scanner) content(depth int, texts *[]string) {
	switch s.peek() {
	case 'n':
		s.literal("null")
	case '"':
		raw, escaped := s.rawString()
		if s.err == nil {
			*texts = append((*texts)[:0], decode(raw, escaped))
		}
	case '[':
		var kept []string
		s.array(depth, func() {
			var typ, text string
			if !s.isNull() {
				if s.peek() != '{' {
					s.typeErr("content", "object")
					return
				}
				s.object(depth+1, func(key []byte) {
					switch {
					case is(key, "type"):
						s.str(&typ, "type")
					case is(key, "text"):
						s.str(&text, "text")
					default:
						s.skip(depth + 1)
					}
				})
			}
			if typ == "text" {
				kept = append(kept, text)
			}
		})
		*texts = append((*texts)[:0], kept...)
	default:
		s.skip(depth)
		if s.err == nil {
			s.fail(errors.New("content: want a string or an array of parts"))
		}
	}
}

// completions renders the prompt (see promptText).
func completions(body []byte) (Request, error) {
	req := Request{Kind: KindCompletions}
	var prompt []byte
	s := &scanner{b: body}
	err := s.top("completions body", func(key []byte) {
		switch {
		case s.shared(key, &req):
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
	w := newWriter(len(body))
	if err := promptText(w, prompt); err != nil {
		return Request{}, fmt.Errorf("prompt: %w", err)
	}
	w.done(&req)
	return req, nil
}

// generate handles SGLang's native /generate: text, or else input_ids.
func generate(body []byte) (Request, error) {
	req := Request{Kind: KindGenerate}
	var text, ids []byte
	s := &scanner{b: body}
	err := s.top("generate body", func(key []byte) {
		switch {
		case s.shared(key, &req):
		case is(key, "text"):
			text = s.raw(1)
		case is(key, "input_ids"):
			ids = s.raw(1)
		case is(key, "sampling_params"):
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
	w := newWriter(len(body))
	field, raw := "text", text
	if isNull(raw) {
		field, raw = "input_ids", ids
	}
	if err := promptText(w, raw); err != nil {
		return Request{}, fmt.Errorf("%s: %w", field, err)
	}
	w.done(&req)
	return req, nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) == 0 || raw[0] == 'n'
}

// promptText renders a polymorphic prompt: a string; an array of strings
// (joined by "\n"); an array of token ids (decimal, space-separated, so
// prompts sharing leading ids share a text prefix); or an array of such
// arrays (joined by "\n"). Absent or null renders as "".
func promptText(w *writer, raw json.RawMessage) error {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] == 'n' {
		return nil
	}
	if raw[0] == '"' { // validated by the scanner
		w.str(decode(raw, bytes.IndexByte(raw, '\\') >= 0))
		return nil
	}
	if raw[0] != '[' {
		return errors.New("want a string, an array of strings or an array of token ids")
	}
	// The first element decides the shape; json then checks the rest.
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
	default:
		return writeIDs(w, raw)
	}
	return nil
}

// writeIDs renders an array of token ids, or an array of arrays of them,
// copying each id's digits as they are (JSON allows no leading zeros, so
// equal ids have equal digits). raw is a valid JSON array (the caller's
// json.Unmarshal checked it); this only checks the shape and that every
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
			w.id(raw[i:j])
			wrote = true
			i = j
		default:
			return errors.New("want token ids (integers)")
		}
	}
	return nil
}

// writer builds Text up to MaxTextBytes, and counts what it was given.
type writer struct {
	b         []byte
	cut       bool
	textBytes int // text given (cut or not)
	ids       int // token ids given
}

func newWriter(hint int) *writer {
	return &writer{b: make([]byte, 0, min(hint, MaxTextBytes))}
}

// sep appends a separator of Sluice's rendering (not counted as text).
func (w *writer) sep(s string) {
	n := w.textBytes
	w.str(s)
	w.textBytes = n
}

func (w *writer) str(s string) {
	w.textBytes += len(s)
	if w.cut {
		return
	}
	if room := MaxTextBytes - len(w.b); len(s) > room {
		// Cut on a rune boundary so Text stays valid UTF-8.
		for room > 0 && !utf8.RuneStart(s[room]) {
			room--
		}
		s, w.cut = s[:room], true
	}
	w.b = append(w.b, s...)
}

// id appends one token id's digits (ASCII: any cut is a rune boundary).
func (w *writer) id(b []byte) {
	w.ids++
	if w.cut {
		return
	}
	if room := MaxTextBytes - len(w.b); len(b) > room {
		b, w.cut = b[:room], true
	}
	w.b = append(w.b, b...)
}

// done fills the request's Text, Truncated and PromptTokens.
func (w *writer) done(req *Request) {
	req.Text, req.Truncated = string(w.b), w.cut
	req.TokenIDs = w.ids > 0 && w.textBytes == 0
	req.PromptTokens = w.ids + (w.textBytes+3)/4
}
