package reqtext

import (
	"encoding/json"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// allocated is the heap bytes f allocates (runtime.MemStats.TotalAlloc:
// every allocation, freed or not, so an upper bound on what f holds).
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// repeated is prefix + elem, elem, ... + suffix, about n bytes long.
func repeated(prefix, elem, suffix string, n int) string {
	k := (n - len(prefix) - len(suffix)) / (len(elem) + 1)
	return prefix + strings.TrimSuffix(strings.Repeat(elem+",", k), ",") + suffix
}

// A client's body is bounded (max_body_bytes, 4 MiB by default) but what
// Sluice builds from it must be bounded by a small multiple of it too,
// whatever its shape: millions of tiny array elements cost one small
// allocation each (a chat message of "{}" cost 380 bytes), so a few
// concurrent 4 MiB bodies held gigabytes.
func TestHostileBodiesCostASmallMultipleOfTheirSize(t *testing.T) {
	const n = 4 << 20
	for _, c := range []struct{ name, path, body string }{
		{"empty messages", "/v1/chat/completions", repeated(`{"messages":[`, `{}`, `]}`, n)},
		{"null messages", "/v1/chat/completions", repeated(`{"messages":[`, `null`, `]}`, n)},
		{"role-only messages", "/v1/chat/completions", repeated(`{"messages":[`, `{"role":"a"}`, `]}`, n)},
		{"content-only messages", "/v1/chat/completions", repeated(`{"messages":[`, `{"content":"a"}`, `]}`, n)},
		{"escaped messages", "/v1/chat/completions", repeated(`{"messages":[`, `{"role":"\n","content":"\n"}`, `]}`, n)},
		{"text parts", "/v1/chat/completions", repeated(`{"messages":[{"role":"user","content":[`, `{"type":"text"}`, `]}]}`, n)},
		{"empty parts", "/v1/chat/completions", repeated(`{"messages":[{"content":[`, `{}`, `]}]}`, n)},
		{"array contents", "/v1/chat/completions", repeated(`{"messages":[`, `{"content":[null]}`, `]}`, n)},
		{"repeated messages keys", "/v1/chat/completions", repeated(`{`, `"messages":[{}]`, `}`, n)},
		{"repeated models", "/v1/chat/completions", repeated(`{`, `"model":"\u00e9"`, `}`, n)},
		{"empty prompts", "/v1/completions", repeated(`{"prompt":[`, `""`, `]}`, n)},
		{"one-letter prompts", "/v1/completions", repeated(`{"prompt":[`, `"a"`, `]}`, n)},
		{"escaped prompts", "/v1/completions", repeated(`{"prompt":[`, `"\t"`, `]}`, n)},
		{"token ids", "/v1/completions", repeated(`{"prompt":[`, `1`, `]}`, n)},
		{"token id arrays", "/v1/completions", repeated(`{"prompt":[`, `[1]`, `]}`, n)},
		{"escaped keys", "/v1/completions", repeated(`{`, `"\u0061":1`, `}`, n)},
		{"escaped prompt", "/v1/completions", `{"prompt":"` + strings.Repeat(`\u00e9`, n/6) + `"}`},
		{"generate texts", "/generate", repeated(`{"text":[`, `""`, `]}`, n)},
		{"media parts", "/v1/chat/completions", repeated(`{"messages":[{"content":[`, `{}`, `]}]}`, n)},
		{"media parts in messages", "/v1/chat/completions", repeated(`{"messages":[`, `{"content":[{}]}`, `]}`, n)},
		{"message fields", "/v1/chat/completions", repeated(`{"messages":[`, `{"name":""}`, `]}`, n)},
		{"repeated message fields", "/v1/chat/completions", repeated(`{"messages":[{`, `"tool_calls":[1]`, `}]}`, n)},
		{"repeated tools", "/v1/chat/completions", repeated(`{`, `"tools":[]`, `}`, n)},
		{"tgi prompts", "/generate", repeated(`{"inputs":[`, `""`, `]}`, n)},
		{"triton prompts", "/v2/models/m/generate_stream", repeated(`{"text_input":[`, `""`, `],"parameters":{"max_tokens":1}}`, n)},
		{"other path", "/v1/embeddings", repeated(`{"x":[`, `{}`, `]}`, n)},
	} {
		body := []byte(c.body)
		var err error
		got := allocated(func() { _, err = Extract(c.path, body) })
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if limit := uint64(len(body)); got > limit {
			t.Errorf("%s: a %d-byte body allocated %d bytes (%.1fx), want at most its size",
				c.name, len(body), got, float64(got)/float64(len(body)))
		}
	}
}

// Messages is for a tokenizer that asks the engine for the first messages
// (kvevents' cuts, 1024 at most); a body of millions of tiny messages must
// not cost a slice header each.
func TestMessagesAreBounded(t *testing.T) {
	body := repeated(`{"messages":[`, `{"role":"user","content":"x"}`, `]}`, 1<<20)
	req := mustExtract(t, "/v1/chat/completions", body)
	if len(req.Messages) != MaxMessages {
		t.Fatalf("%d messages kept, want the first %d", len(req.Messages), MaxMessages)
	}
	for i, m := range req.Messages {
		if string(m) != `{"role":"user","content":"x"}` {
			t.Fatalf("message %d: %q", i, m)
		}
	}
	if want := strings.Repeat("<|user|>\nx\n", strings.Count(body, "user")); req.Text != want {
		t.Fatalf("text of %d bytes, want %d (every message)", len(req.Text), len(want))
	}
}

// The engines Sluice routes to (vLLM, SGLang: Python's json and pydantic)
// match a field's name exactly and take the last of a key given twice.
// Sluice must read the same field, or a client routes and is weighed on
// one prompt and served another: {"prompt": <100k tokens>, "PROMPT":
// "hi"} passed flow control's token gate as 1 token, and pinned the
// prefix of "hi" on a replica that never computed it.
func TestFieldsAreTheOnesTheEngineReads(t *testing.T) {
	long := strings.Repeat("lorem ipsum ", 1000)
	for _, c := range []struct {
		name, path, body string
		want             Request
	}{
		{"other case ignored", "/v1/completions",
			`{"model":"m","prompt":` + quote(long) + `,"PROMPT":"hi","Model":"x","MAX_TOKENS":9,"Stream":true}`,
			Request{Kind: KindCompletions, Model: "m", Text: long}},
		{"other case alone", "/v1/completions", `{"Prompt":"hi","mOdel":"x"}`,
			Request{Kind: KindCompletions}},
		{"unicode fold ignored", "/v1/completions", `{"prompt":"a","ſtream":true,"max_toKens":5}`,
			Request{Kind: KindCompletions, Text: "a"}},
		{"chat other case", "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"real"}],"Messages":[{"role":"user","content":"fake"}]}`,
			Request{Kind: KindChat, Text: "<|user|>\nreal\n"}},
		{"message fields other case", "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"real","Content":"fake","ROLE":"x"}]}`,
			Request{Kind: KindChat, Text: "<|user|>\nreal\n"}},
		{"part fields other case", "/v1/chat/completions",
			`{"messages":[{"role":"user","content":[{"type":"text","text":"real","Text":"fake"},{"Type":"text","text":"no"}]}]}`,
			Request{Kind: KindChat, Text: "<|user|>\nreal\n" + markerOf(`{"Type":"text","text":"no"}`) + "\n"}}, // a part of no type: not text
		{"escaped key is the key", "/v1/completions", `{"pr\u006fmpt":"a"}`,
			Request{Kind: KindCompletions, Text: "a"}},
		{"last prompt wins", "/v1/completions", `{"prompt":"a","prompt":"b"}`,
			Request{Kind: KindCompletions, Text: "b"}},
		{"last model wins, null too", "/v1/completions", `{"model":"a","model":null,"prompt":"p"}`,
			Request{Kind: KindCompletions, Text: "p"}},
		{"null prompt last", "/v1/completions", `{"prompt":"a","prompt":null}`,
			Request{Kind: KindCompletions}},
		{"null max_tokens last", "/v1/completions", `{"max_tokens":5,"max_tokens":null,"stream":true,"stream":null}`,
			Request{Kind: KindCompletions}},
		{"null role last", "/v1/chat/completions", `{"messages":[{"role":"a","role":null,"content":"c"}]}`,
			Request{Kind: KindChat, Text: "<||>\nc\n"}},
		{"null content last", "/v1/chat/completions", `{"messages":[{"role":"a","content":"c","content":null}]}`,
			Request{Kind: KindChat, Text: "<|a|>\n\n"}},
		{"last messages win", "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}`,
			Request{Kind: KindChat, Text: "<|user|>\nb\n"}},
		{"null messages last", "/v1/chat/completions",
			`{"messages":[{"role":"user","content":"a"}],"messages":null}`,
			Request{Kind: KindChat}},
		{"last text part field wins", "/v1/chat/completions",
			`{"messages":[{"role":"u","content":[{"text":"a","type":"text","text":"b"},{"type":"text","type":"image_url","text":"c"}]}]}`,
			Request{Kind: KindChat, Text: "<|u|>\nb\n" + markerOf(`{"type":"text","type":"image_url","text":"c"}`) + "\n"}},
	} {
		got, err := Extract(c.path, []byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		c.want.PromptTokens = (len(markers.ReplaceAllString(c.want.Text, "")) + 3) / 4
		if got.Kind == KindChat && c.name != "null messages last" {
			if len(got.Messages) != 1 {
				t.Errorf("%s: %d messages", c.name, len(got.Messages))
			}
		} else if got.Messages != nil {
			t.Errorf("%s: messages %q", c.name, got.Messages)
		}
		got.Messages = nil
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

// markers are the markers in a text (not counted as text).
var markers = regexp.MustCompile(`<\|#[0-9a-f]{16}\|>`)

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Strings decode as encoding/json decodes them: escapes, surrogate pairs,
// a lone surrogate or an invalid byte as U+FFFD; NUL (escaped) kept.
func TestStringsDecodeAsJSON(t *testing.T) {
	for _, in := range []string{
		`"plain"`, `"tab\there"`, `"\"\\\/\b\f\n\r\t"`, `"\u00e9\u65e5"`, `"\ud83d\ude00"`,
		`"\ud800"`, `"\ud800x"`, `"\ud800\u0041"`, `"\udc00\ud800"`, `"\ud83d\ud83d\ude00"`,
		`"\u0000nul"`, "\"bad \xff byte\"", "\"cut \xe6\x97\"", "\"\xed\xa0\x80 surrogate bytes\"",
		`"\uD83D\uDE00"`, "\"mix \xff\\n\"",
	} {
		var want string
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		req := mustExtract(t, "/v1/completions", `{"prompt":`+in+`}`)
		if req.Text != want {
			t.Errorf("%q: got %q, want %q", in, req.Text, want)
		}
	}
}

// The string decoder against encoding/json's, on any string content.
func FuzzDecodeMatchesEncodingJSON(f *testing.F) {
	for _, seed := range []string{`plain`, `\ud83d\ude00`, `\ud800\u0041`, "\xff\xed\xa0\x80", `\u0000\"\\\/\b\f\n\r\t`, `\uDBFF\uDFFF\uD800`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		raw := append(append([]byte{'"'}, in...), '"')
		var want string
		if json.Unmarshal(raw, &want) != nil {
			return
		}
		s := &scanner{b: raw}
		got, escaped := s.rawString()
		if s.err != nil {
			t.Fatalf("%q: %v", raw, s.err)
		}
		if d := decode(got, escaped); d != want {
			t.Fatalf("%q: decoded %q, want %q", raw, d, want)
		}
		if !equals(got, want) || want != "" && equals(got, want+"x") {
			t.Fatalf("%q: equals disagrees", raw)
		}
	})
}
