package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReviewS33PromptCountInPlace: counting a prompt reads its JSON in
// place. Decoding it into Go values first held every element at once, so
// an 8 MiB body of token ids (the default max_body) cost some 360 MB of
// allocations, about 45 times its size, from any client.
func TestReviewS33PromptCountInPlace(t *testing.T) {
	ids := json.RawMessage("[" + strings.Repeat("12345,", 1<<20) + "7]")
	texts := json.RawMessage("[" + strings.Repeat(`"abcd",`, 1<<17) + `"é"]`)
	parts := json.RawMessage(`[` + strings.Repeat(`{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"x"}},`, 1<<15) + `"x"]`)
	for _, tc := range []struct {
		name   string
		raw    json.RawMessage
		parts  bool
		tokens int
		chars  int
	}{
		{"token ids", ids, false, 1<<20 + 1, 0},
		{"strings", texts, false, 0, 4<<17 + 2},
		{"content parts", parts, true, 0, 4<<15 + 1},
	} {
		var pc promptCount
		allocs := testing.AllocsPerRun(2, func() {
			pc = promptCount{}
			if err := pc.add(tc.raw, tc.parts); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		})
		if pc.tokens != tc.tokens || pc.chars != tc.chars {
			t.Errorf("%s: counted %d tokens and %d chars, want %d and %d", tc.name, pc.tokens, pc.chars, tc.tokens, tc.chars)
		}
		if allocs > 16 {
			t.Errorf("%s: counting a %d-byte prompt made %.0f allocations, want a handful (it reads the JSON in place)", tc.name, len(tc.raw), allocs)
		}
	}
}

// referenceCount is how prompts were counted before: decoded into Go
// values, then walked. The in-place count must agree with it, so that
// prompt token counts (and every figure that depends on them) stay put.
func referenceCount(raw json.RawMessage, parts bool) (promptCount, error) {
	var pc promptCount
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return pc, err
	}
	var walk func(v any, depth int) error
	walk = func(v any, depth int) error {
		if depth > 3 {
			return errors.New("nested too deeply")
		}
		switch x := v.(type) {
		case nil:
		case string:
			pc.chars += len(x)
		case float64:
			pc.tokens++
		case []any:
			for _, e := range x {
				if m, ok := e.(map[string]any); ok && parts {
					if _, ok := m["text"].(string); !ok {
						continue
					}
				}
				if err := walk(e, depth+1); err != nil {
					return err
				}
			}
		case map[string]any:
			if !parts {
				return errors.New("expected a string, a token id or an array of those")
			}
			if t, ok := x["text"].(string); ok {
				pc.chars += len(t)
			}
		default:
			return fmt.Errorf("unexpected %T", v)
		}
		return nil
	}
	return pc, walk(v, 0)
}

func TestReviewS33PromptCountMatchesDecoding(t *testing.T) {
	cases := []string{
		`"hello"`, `""`, `null`, `7`, `-1.5e3`, `1e400`, `1e-400`, `true`, `false`, `{}`, `[]`,
		`"a\nb\"c\\d\/e\u00e9\u0000"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx"`, `"\ud83d\u0041"`, `"\udc00\ud83d\ude00"`,
		"\"\xff\xfe ok\"", "\"caf\xc3\xa9\"", "\"\xe2\x82\"",
		`["a", 1, [2, ["b", [3]]]]`, `[[[["x"]]]]`, `[[[[null]]]]`, `[[[1]]]`, `[[[[]]]]`, `[[[[{}]]]]`,
		`[{"text":"x"}]`, `[[[[{"type":"image"}]]]]`, `[[[[{"text":"deep"}]]]]`, `[[[{"text":"ok"}]]]`,
		`{"text":"top"}`, `{"text":5}`, `{"text":"a","text":"bcd"}`, `{"text":"a","text":5}`, `{"t\u0065xt":"esc"}`,
		`[{"text":{"nested":[1,2,{"x":"]"}]}}, "after"]`, `[{"type":"text","text":"x","extra":[[[[[[1]]]]]]}]`,
		`[true]`, `["a", false]`, `[1, {"a":1}]`, ` [ 1 , "x" ] `, `[1e400, [[[["deep"]]]]]`,
	}
	rng := rand.New(rand.NewPCG(33, 33))
	var gen func(depth int) string
	gen = func(depth int) string {
		switch k := rng.IntN(10); {
		case k < 3 || depth > 5:
			return []string{`"abc"`, `"\u00e9\n"`, `12`, `-0.5`, `null`, `""`, "\"\xff\"", `"\ud800"`}[rng.IntN(8)]
		case k < 7:
			n := rng.IntN(4)
			el := make([]string, n)
			for i := range el {
				el[i] = gen(depth + 1)
			}
			return "[" + strings.Join(el, ",") + "]"
		default:
			keys := []string{`"text"`, `"type"`, `"t\u0065xt"`, `"x"`}
			n := rng.IntN(3)
			el := make([]string, n)
			for i := range el {
				el[i] = keys[rng.IntN(len(keys))] + ":" + gen(depth+1)
			}
			return "{" + strings.Join(el, ",") + "}"
		}
	}
	for range 3000 {
		cases = append(cases, gen(0))
	}
	for _, c := range cases {
		for _, parts := range []bool{false, true} {
			want, werr := referenceCount(json.RawMessage(c), parts)
			var got promptCount
			gerr := got.add(json.RawMessage(c), parts)
			if (werr == nil) != (gerr == nil) || (werr == nil && got != want) {
				t.Fatalf("%s (parts %v): counted %+v, err %v; decoding gives %+v, err %v", c, parts, got, gerr, want, werr)
			}
		}
	}
}

// TestReviewS33MessagesCountInPlace: a chat's messages are counted in place
// too: decoding them into one value per message cost some 60 times the
// body (475 MB for 8 MB of null messages).
func TestReviewS33MessagesCountInPlace(t *testing.T) {
	rp, err := New(Config{}) // no prefix cache: the router's rendering is not run
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	const n = 1 << 16
	body := `{"messages":[` + strings.Repeat(`{"role":"user","content":"abcdefgh"},null,{"role":"user","content":[{"type":"text","text":"abcd"}]},`, n) +
		`{"content":"x"}],"max_tokens":2}`
	var req inferenceRequest
	allocs := testing.AllocsPerRun(1, func() {
		w := httptest.NewRecorder()
		var status int
		var err error
		req, status, err = rp.parseRequest(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		if err != nil {
			t.Fatalf("status %d: %v", status, err)
		}
	})
	if want := (12*n + 1) / 4; req.PromptTokens != want {
		t.Errorf("prompt tokens %d, want %d", req.PromptTokens, want)
	}
	if allocs > 200 {
		t.Errorf("parsing a %d-byte chat of %d messages made %.0f allocations, want a few dozen (its messages read in place)", len(body), 3*n+1, allocs)
	}
}

// referenceMessages is how a chat's messages were counted before.
func referenceMessages(body string) (promptCount, bool, error) {
	var wr struct {
		Messages []json.RawMessage `json:"messages"`
	}
	var pc promptCount
	if err := json.Unmarshal([]byte(body), &wr); err != nil {
		return pc, false, err
	}
	for _, m := range wr.Messages {
		var msg struct {
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(m, &msg); err != nil {
			return pc, true, err
		}
		if !isAbsent(msg.Content) {
			c, err := referenceCount(msg.Content, true)
			pc.chars += c.chars
			pc.tokens += c.tokens
			if err != nil {
				return pc, true, err
			}
		}
	}
	return pc, wr.Messages != nil, nil
}

func TestReviewS33MessagesCountMatchesDecoding(t *testing.T) {
	rp, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	for _, msgs := range []string{
		`null`, `[]`, `[null]`, `"x"`, `{}`, `5`, `[5]`, `["x"]`, `[[]]`, `[{}]`, `[{"content":null}]`,
		`[{"content":"abcdefgh"}]`, `[{"Content":"abcdefgh"}]`, `[{"CONTENT":"abcd","content":"abcdefgh"}]`,
		`[{"content":"abcdefgh","content":null}]`, `[{"c\u006fntent":"abcdefgh"}]`, `[{"role":"user","content":[{"type":"text","text":"abcdefgh"}]}]`,
		`[{"content":true}]`, `[{"content":[[[["x"]]]]}]`, `[{"content":"abcd"}, 7]`, `[{"content":{"text":"abcdefgh"}}]`,
		`[{"role":"system","content":"abcdefghabcdefgh"},null,{"role":"user","content":["abcd",{"type":"image_url"}]}]`,
	} {
		body := `{"messages":` + msgs + `}`
		want, present, werr := referenceMessages(body)
		req, status, err := rp.parseRequest(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		switch {
		case werr != nil || !present:
			if err == nil || status != http.StatusBadRequest {
				t.Errorf("%s: status %d, err %v; decoding gives present %v, err %v", msgs, status, err, present, werr)
			}
		case err != nil || req.PromptTokens != max(1, want.tokens+want.chars/4):
			t.Errorf("%s: %d prompt tokens, err %v; decoding gives %+v", msgs, req.PromptTokens, err, want)
		}
	}
}
