package kvevents

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-router/sluice/lb"
)

// The engine tokenizer against the real llm-d-inference-sim: its /tokenize
// (vLLM's shape) runs without --force-dummy-tokenizer (a model it has no
// tokenizer for uses its own rule), and the ids Sluice gets from it key the
// blocks the sim's KV events report for the same prompt. Ports: HTTP one
// free a moment ago (the sim must be told it), ZMQ the listener's.

// warm asks until the tokenizer's background requests have cached an
// answer for p, and returns it. Each call only reads the cache and, on a
// miss, starts a request: the first answer is always a miss.
func warm(t *testing.T, e *EngineTokenizer, p Prompt, whole bool) []uint32 {
	t.Helper()
	var tokens []uint32
	waitFor(t, "the engine's tokens in the cache", func() bool {
		tk, total, ok := e.TokenizePrompt(p)
		tokens = tk
		return ok && (!whole || total == len(tk) && e.Stats().Hits > 0)
	})
	return tokens
}

func TestEngineTokenizerKeysWhatTheSimCaches(t *testing.T) {
	bin := llmdSim(t)
	httpPort := freePort(t)
	pod := fmt.Sprintf("127.0.0.1:%d", httpPort)
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: func(p string) (string, bool) { return p, p == pod }})
	defer l.Close()
	startSimReal(t, bin, httpPort, portOf(l.Addr()), 256)
	e := NewEngineTokenizer(EngineConfig{})
	defer e.Close()
	held := func(tokens []uint32) int { return ix.Match(ix.Keys(tokens), []string{pod})[0] }

	// A completion prompt: the first look is a miss (the pick goes on
	// without waiting); the cache then holds its longest cut, and a
	// repeat asks for the whole text.
	a := Prompt{Model: "m", Text: prompt("alpha", 80), Replicas: []string{pod}}
	if _, _, ok := e.TokenizePrompt(a); ok {
		t.Fatal("a cold prompt had tokens")
	}
	full := tokenize(t, pod, a.Text)
	got := warm(t, e, a, true)
	if !slices.Equal(got, full) {
		t.Fatalf("the whole prompt: engine tokenizer %v, the sim's /tokenize %v", got, full)
	}
	waitFor(t, "A's blocks in the index", func() bool { complete(t, pod, a.Text); return held(got) == 5 })

	// A chat request: the engine renders the messages with its template;
	// the ids it gives for them are the ones its KV events carry.
	msgs := []json.RawMessage{
		json.RawMessage(`{"role":"system","content":` + jsonString(prompt("sys", 40)) + `}`),
		json.RawMessage(`{"role":"user","content":` + jsonString(prompt("ask", 30)) + `}`),
	}
	c := Prompt{Model: "m", Text: "rendered by Sluice, not what the engine sees", Messages: msgs, Replicas: []string{pod}}
	chatTokens := warm(t, e, c, true)
	if len(chatTokens) < 64 {
		t.Fatalf("chat tokens: %d", len(chatTokens))
	}
	waitFor(t, "the chat's blocks in the index", func() bool {
		postJSON(t, "http://"+pod+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 1}, nil)
		return held(chatTokens) == len(chatTokens)/16
	})
	// The next turn starts with this conversation: its cached prefix
	// (less the margin) is a prefix of the next turn's ids.
	next := Prompt{Model: "m", Text: "x", Replicas: []string{pod}, Messages: append(slices.Clone(msgs),
		json.RawMessage(`{"role":"assistant","content":"fine"}`), json.RawMessage(`{"role":"user","content":"more"}`))}
	pre, total, ok := e.TokenizePrompt(next)
	var nextTokens struct {
		Tokens []uint32 `json:"tokens"`
	}
	postJSON(t, "http://"+pod+"/tokenize", map[string]any{"model": "m", "messages": next.Messages}, &nextTokens)
	if !ok || total <= len(pre) || len(pre) != len(chatTokens)-8 || !slices.Equal(pre, nextTokens.Tokens[:len(pre)]) {
		t.Fatalf("next turn: ok %v, %d of ~%d tokens: %v, the engine's %v", ok, len(pre), total, pre, nextTokens.Tokens)
	}
	if s := e.Stats(); len(s.Failures) != 0 || s.Requests == 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// Prompts that share only a prefix (a system prompt or a document) find
// it from the third on: the second one's lookup sees that the first had
// the same cut and asks for it. What a cached prefix gives is a prefix of
// the whole prompt's ids, whatever the cut splits (here mid-word).
func TestEngineTokenizerSharedPrefix(t *testing.T) {
	bin := llmdSim(t)
	httpPort := freePort(t)
	pod := fmt.Sprintf("127.0.0.1:%d", httpPort)
	startSimReal(t, bin, httpPort, refusingPort(t), 64) // its events go nowhere
	e := NewEngineTokenizer(EngineConfig{CutBytes: 100})
	defer e.Close()
	shared := prompt("document", 90) // ~900 bytes
	ask := func(i int) Prompt {
		return Prompt{Model: "m", Text: shared + fmt.Sprintf(" question%d about it please", i), Replicas: []string{pod}}
	}
	e.TokenizePrompt(ask(1))
	e.TokenizePrompt(ask(2))
	for i := 3; ; i++ {
		p := ask(i)
		tokens, total, ok := e.TokenizePrompt(p)
		if ok {
			full := tokenize(t, pod, p.Text)
			if len(tokens) < 64 || !slices.Equal(tokens, full[:len(tokens)]) || total < len(tokens) {
				t.Fatalf("prefix of %d tokens (of ~%d) is not a prefix of the prompt's %d: %v", len(tokens), total, len(full), tokens)
			}
			break
		}
		if i > 500 {
			t.Fatal("the shared prefix never came")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startSimReal runs the sim with its own tokenizer choice (no
// --force-dummy-tokenizer: the model "m" is not a real one, so it uses its
// simulated rule; that is what /tokenize answers with too).
func startSimReal(t *testing.T, bin string, httpPort, zmqPort, kvBlocks int) {
	t.Helper()
	startSimArgs(t, bin, httpPort, []string{"--model", "m", "--port", fmt.Sprint(httpPort), "--mode", "echo",
		"--enable-kvcache", "--kv-cache-size", fmt.Sprint(kvBlocks), "--block-size", "16",
		"--event-batch-size", "1", "--zmq-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", zmqPort)})
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// noLeaksAfter checks, after the test and its cleanups (test servers
// included), that no goroutine it started is left.
func noLeaksAfter(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// hostile is an engine whose /tokenize answers badly.
// The request body is read first: the server notices a client that went
// away (and cancels r.Context()) only after that; a handler that waits
// also ends when the test does.
func hostile(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) string {
	t.Helper()
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		answer(w, r.WithContext(ctx))
	}))
	t.Cleanup(func() { close(stop); srv.Close() })
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestEngineTokenizerHostileAnswers(t *testing.T) {
	noLeaksAfter(t)
	long := strings.Repeat("7,", 2000)
	for _, c := range []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		reason string
	}{
		{"slow", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, TokTimeout},
		{"slow body", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"tokens":[1,`))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, TokTimeout},
		{"status", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusInternalServerError) }, TokStatus},
		{"redirect", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/elsewhere", http.StatusFound) }, TokStatus},
		{"huge", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"tokens":[`))
			for i := 0; i < 1000; i++ {
				w.Write([]byte(strings.Repeat(" ", 1024)))
			}
		}, TokTooLarge},
		{"too many ids", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, `{"tokens":[%s7]}`, long) }, TokTooMany},
		{"not json", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>")) }, TokBadAnswer},
		{"no tokens", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"count":0}`)) }, TokBadAnswer},
		{"empty", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[],"count":0}`)) }, TokBadAnswer},
		{"negative", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[1,-2]}`)) }, TokBadAnswer},
		{"too big", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[4294967296]}`)) }, TokBadAnswer},
		{"float", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[1.5]}`)) }, TokBadAnswer},
		{"nested", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[[1,2]]}`)) }, TokBadAnswer},
		{"count disagrees", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[1,2],"count":3}`)) }, TokBadAnswer},
		{"closed", func(w http.ResponseWriter, r *http.Request) {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		}, TokUnreachable},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := hostile(t, c.answer)
			e := NewEngineTokenizer(EngineConfig{Timeout: 200 * time.Millisecond, MaxAnswerBytes: 512 << 10, MaxTokens: 1000})
			p := Prompt{Model: "m", Text: "short prompt", Replicas: []string{addr}}
			if _, _, ok := e.TokenizePrompt(p); ok {
				t.Fatal("tokens from nowhere")
			}
			waitFor(t, "the answer", func() bool { return e.Stats().Failures[c.reason] == 1 })
			// Backing off: the same prompt does not ask again at once.
			if _, _, ok := e.TokenizePrompt(p); ok {
				t.Fatal("a failed answer was cached")
			}
			e.Close()
			if s := e.Stats(); s.Requests != 1 || s.Stored != 0 || len(s.Failures) != 1 {
				t.Fatalf("stats: %+v", s)
			}
		})
	}
}

// At most Concurrency requests run; a miss beyond is not asked (counted),
// and Close ends the ones in flight.
func TestEngineTokenizerBounded(t *testing.T) {
	noLeaksAfter(t)
	var inFlight atomic.Int32
	release := make(chan struct{})
	addr := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		select {
		case <-release:
			fmt.Fprint(w, `{"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20],"count":20}`)
		case <-r.Context().Done():
		}
	})
	e := NewEngineTokenizer(EngineConfig{Concurrency: 2, MaxEntries: 2, Timeout: time.Minute})
	for i := 0; i < 5; i++ {
		e.TokenizePrompt(Prompt{Model: "m", Text: fmt.Sprintf("prompt %d", i), Replicas: []string{addr}})
	}
	waitFor(t, "two requests at the engine", func() bool { return inFlight.Load() == 2 })
	if s := e.Stats(); s.Failures[TokBusy] != 3 || s.Misses != 5 {
		t.Fatalf("stats: %+v", s)
	}
	close(release)
	waitFor(t, "both answers", func() bool { return e.Stats().Stored == 2 })
	for i := 5; i < 8; i++ {
		p := Prompt{Model: "m", Text: fmt.Sprintf("prompt %d", i), Replicas: []string{addr}}
		e.TokenizePrompt(p)
		waitFor(t, "the answer", func() bool { _, _, ok := e.TokenizePrompt(p); return ok })
	}
	if s := e.Stats(); s.Entries != 2 || s.Evicted != 3 || s.Bytes != 2*(20*4+entryOverhead) {
		t.Fatalf("bounds: %+v", s)
	}
	// Tokens of another model are not this model's.
	if _, _, ok := e.TokenizePrompt(Prompt{Model: "other", Text: "prompt 7"}); ok {
		t.Fatal("a model's tokens served for another")
	}
	e.Close()
	e.Close()
}

// A request in flight when the tokenizer closes is cancelled, not waited
// out.
func TestEngineTokenizerCloseCancels(t *testing.T) {
	noLeaksAfter(t)
	var arrived atomic.Bool
	addr := hostile(t, func(w http.ResponseWriter, r *http.Request) { arrived.Store(true); <-r.Context().Done() })
	e := NewEngineTokenizer(EngineConfig{Timeout: time.Hour})
	e.TokenizePrompt(Prompt{Text: "x", Replicas: []string{addr}})
	waitFor(t, "the request", arrived.Load)
	e.Close()
	if _, _, ok := e.TokenizePrompt(Prompt{Text: "x", Replicas: []string{addr}}); ok || e.Stats().Requests != 1 {
		t.Fatalf("after Close: %+v", e.Stats())
	}
}

// The cuts: every CutBytes bytes on a rune boundary, the whole text last;
// the same leading text gives the same keys whatever follows.
func TestEngineTokenizerCuts(t *testing.T) {
	e := NewEngineTokenizer(EngineConfig{CutBytes: 4})
	defer e.Close()
	a := e.cuts(Prompt{Model: "m", Text: "abcdéfghij"}) // é is 2 bytes at 4..5
	b := e.cuts(Prompt{Model: "m", Text: "abcdéfgh+other"})
	ends := func(cs []cut) (out []int) {
		for _, c := range cs {
			out = append(out, c.end)
		}
		return out
	}
	if got := ends(a); !slices.Equal(got, []int{4, 8, 11}) || !a[2].whole || a[1].whole {
		t.Fatalf("cuts %v", got)
	}
	if a[0].key != b[0].key || a[1].key != b[1].key || a[2].key == b[2].key {
		t.Fatal("shared text, different keys")
	}
	c := e.cuts(Prompt{Model: "m2", Text: "abcdéfghij"})
	if c[0].key == a[0].key {
		t.Fatal("the model is not in the key")
	}
	mid := e.cuts(Prompt{Text: "ab\u6771xyz"}) // the 3-byte rune spans 2..4: the cut backs off to 2
	if got := ends(mid); !slices.Equal(got, []int{2, 8}) {
		t.Fatalf("mid-rune cuts %v", got)
	}
	if e.cuts(Prompt{Text: ""}) != nil {
		t.Fatal("cuts of nothing")
	}
	m := e.cuts(Prompt{Messages: []json.RawMessage{json.RawMessage(`{"a":1}`), json.RawMessage(`{"b":2}`)}})
	if len(m) != 2 || !m[1].whole || m[0].whole {
		t.Fatalf("message cuts %+v", m)
	}
}

// Token-id prompts are keyed by their ids, with no tokenizer.
func TestPrefixesTokenIDs(t *testing.T) {
	ix := NewIndex(Config{})
	px := &Prefixes{Index: ix, Tokenizer: SimTokenizer{}}
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + i)
	}
	req := &lb.Request{Model: "m", Parsed: true, TokenIDs: true, Text: strings.Join(ids, " ") + "\n5 6"}
	rates, _, _ := px.Lookup(req, []string{"a"})
	if len(rates) != 1 {
		t.Fatalf("rates %v", rates)
	}
	if got, ok := parseIDs("1 2 x"); ok || got != nil {
		t.Fatal("a non-id accepted")
	}
	if got, ok := parseIDs("4294967296"); ok || got != nil {
		t.Fatal("an id past uint32 accepted")
	}
}

// A replica that does not answer is not asked again for Backoff; the
// others are.
func TestEngineTokenizerSkipsAReplicaThatFailed(t *testing.T) {
	noLeaksAfter(t)
	good := hostile(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"tokens":[1,2,3]}`)) })
	dead := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	})
	e := NewEngineTokenizer(EngineConfig{Backoff: time.Hour})
	defer e.Close()
	replicas := []string{dead, good}
	for i := 0; i < 6; i++ {
		p := Prompt{Model: "m", Text: fmt.Sprintf("prompt %d", i), Replicas: replicas}
		e.TokenizePrompt(p)
		waitFor(t, "an answer", func() bool { s := e.Stats(); return s.Stored+s.Failures[TokUnreachable] == uint64(i+1) })
	}
	if s := e.Stats(); s.Failures[TokUnreachable] != 1 || s.Stored != 5 {
		t.Fatalf("stats: %+v", s)
	}
	// All down: nothing is asked.
	e.TokenizePrompt(Prompt{Model: "m", Text: "alone", Replicas: []string{dead}})
	if s := e.Stats(); s.Failures[TokNoReplica] != 1 || s.Requests != 6 {
		t.Fatalf("stats: %+v", s)
	}
}

// The request is vLLM's shape: the prompt cut to the cut's end, or the
// first messages as the client sent them; the model as a JSON string.
func TestTokenizeBody(t *testing.T) {
	text := tokenizeBody(Prompt{Model: `m"x`, Text: "hello world"}, cut{end: 5})
	if string(text) != `{"model":"m\"x","prompt":"hello"}` {
		t.Fatalf("text body %s", text)
	}
	msgs := []json.RawMessage{json.RawMessage(`{"role":"system","content":"a"}`), json.RawMessage(`{"role":"user","content":"b"}`)}
	chat := tokenizeBody(Prompt{Messages: msgs}, cut{end: 1})
	if string(chat) != `{"messages":[{"role":"system","content":"a"}]}` || !json.Valid(chat) {
		t.Fatalf("chat body %s", chat)
	}
}
