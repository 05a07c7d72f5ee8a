package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

type apiKind int

const (
	apiCompletions apiKind = iota // POST /v1/completions
	apiChat                       // POST /v1/chat/completions
	apiGenerate                   // POST /generate (SGLang)
)

// wireRequest is the union of the request fields the simulator reads from the
// OpenAI and SGLang request bodies; everything else is ignored.
type wireRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"` // counted in place (promptCount.addMessages)
	Text                json.RawMessage `json:"text"`
	InputIDs            json.RawMessage `json:"input_ids"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	SamplingParams      *struct {
		MaxNewTokens *int64 `json:"max_new_tokens"`
	} `json:"sampling_params"`
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// inferenceRequest is a parsed inference request.
type inferenceRequest struct {
	Model        string
	PromptTokens int
	OutputTokens int
	Stream       bool
	IncludeUsage bool
	// Prefix holds the prompt's block keys when the prefix cache is on.
	Prefix promptPrefix
}

// parseRequest reads and parses the body. On error it returns the status to
// answer with (statusClientGone if the client went away while sending).
func (rp *Replica) parseRequest(w http.ResponseWriter, r *http.Request) (inferenceRequest, int, error) {
	limit := rp.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return inferenceRequest{}, http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, limit)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return inferenceRequest{}, http.StatusRequestEntityTooLarge,
				fmt.Errorf("request body exceeds the limit of %d bytes", limit)
		}
		if r.Context().Err() != nil {
			return inferenceRequest{}, statusClientGone, err
		}
		return inferenceRequest{}, http.StatusBadRequest, fmt.Errorf("reading request body: %v", err)
	}

	var wr wireRequest
	if err := json.Unmarshal(body, &wr); err != nil {
		return inferenceRequest{}, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %v", err)
	}

	req := inferenceRequest{Model: wr.Model, Stream: wr.Stream}
	if req.Model == "" {
		req.Model = rp.cfg.Model
	}
	req.IncludeUsage = wr.StreamOptions != nil && wr.StreamOptions.IncludeUsage

	var pc promptCount
	present := false
	for _, part := range []struct {
		name string
		raw  json.RawMessage
	}{{"prompt", wr.Prompt}, {"text", wr.Text}, {"input_ids", wr.InputIDs}} {
		if isAbsent(part.raw) {
			continue
		}
		present = true
		if err := pc.add(part.raw, false); err != nil {
			return inferenceRequest{}, http.StatusBadRequest, fmt.Errorf("field %q: %v", part.name, err)
		}
	}
	if !isAbsent(wr.Messages) {
		present = true
		if err := pc.addMessages(wr.Messages); err != nil {
			return inferenceRequest{}, http.StatusBadRequest, err
		}
	}
	if !present {
		return inferenceRequest{}, http.StatusBadRequest,
			errors.New(`the body has no prompt: expected "prompt", "messages", "text" or "input_ids"`)
	}
	req.PromptTokens = max(1, pc.tokens+pc.chars/4)
	if rp.cache != nil {
		req.Prefix = newPromptPrefix(promptText(r.URL.Path, body), rp.cache.blockChars, rp.cache.capacity)
	} else if rp.eng != nil {
		req.Prefix = newPromptPrefix(promptText(r.URL.Path, body), rp.eng.blockChars(), rp.eng.kvBlocks)
	}

	out := int64(rp.cfg.MaxTokens)
	field := ""
	switch {
	case wr.MaxCompletionTokens != nil:
		out, field = *wr.MaxCompletionTokens, "max_completion_tokens"
	case wr.MaxTokens != nil:
		out, field = *wr.MaxTokens, "max_tokens"
	case wr.SamplingParams != nil && wr.SamplingParams.MaxNewTokens != nil:
		out, field = *wr.SamplingParams.MaxNewTokens, "sampling_params.max_new_tokens"
	}
	if out < 1 || out > MaxOutputTokens {
		return inferenceRequest{}, http.StatusBadRequest,
			fmt.Errorf("%s must be between 1 and %d, got %d", field, MaxOutputTokens, out)
	}
	req.OutputTokens = int(out)
	return req, 0, nil
}

func isAbsent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// promptCount accumulates prompt size: characters of text (≈ 4 per token)
// and explicit token ids.
type promptCount struct {
	chars  int
	tokens int
}

// add counts a prompt value: a string, a token id, or arrays of those,
// nested at most 3 deep. With parts set, objects are content parts whose
// "text" is counted (an array's parts without a text string are skipped).
// It reads raw in place: decoding it into Go values first allocated some
// 90 bytes per token id, 45 times the size of a body of token ids.
func (pc *promptCount) add(raw json.RawMessage, parts bool) error {
	if !json.Valid(raw) {
		return errors.New("invalid JSON")
	}
	c := jsonCursor{b: raw}
	return pc.value(&c, parts, 0)
}

// value counts the value at the cursor (valid JSON) at depth depth.
func (pc *promptCount) value(c *jsonCursor, parts bool, depth int) error {
	if c.peek() == '{' {
		text, isText := c.textPart()
		switch {
		case depth > 3 && (!parts || isText):
			return errors.New("nested too deeply")
		case !parts:
			return errors.New("expected a string, a token id or an array of those")
		case isText:
			pc.chars += text
		}
		return nil
	}
	if depth > 3 {
		return errors.New("nested too deeply")
	}
	switch c.peek() {
	case '"':
		pc.chars += stringLen(c.str())
	case '[':
		c.i++
		if c.peek() == ']' {
			c.i++
			return nil
		}
		for {
			if err := pc.value(c, parts, depth+1); err != nil {
				return err
			}
			if c.peek() == ']' {
				c.i++
				return nil
			}
			c.i++ // ','
		}
	default:
		switch lit := c.literal(); lit[0] {
		case 'n':
		case 't', 'f':
			return errors.New("unexpected bool")
		default:
			if err := checkNumber(lit); err != nil {
				return err
			}
			pc.tokens++
		}
	}
	return nil
}

// jsonCursor reads valid JSON in place.
type jsonCursor struct {
	b []byte
	i int
}

// peek skips white space and returns the next byte (0 at the end).
func (c *jsonCursor) peek() byte {
	for ; c.i < len(c.b); c.i++ {
		switch c.b[c.i] {
		case ' ', '\t', '\n', '\r':
		default:
			return c.b[c.i]
		}
	}
	return 0
}

// str returns the string at the cursor, quotes included, and moves past it.
func (c *jsonCursor) str() []byte {
	start := c.i
	for c.i++; c.b[c.i] != '"'; c.i++ {
		if c.b[c.i] == '\\' {
			c.i++
		}
	}
	c.i++
	return c.b[start:c.i]
}

// literal returns the number, true, false or null at the cursor.
func (c *jsonCursor) literal() []byte {
	start := c.i
	for c.i < len(c.b) && !strings.ContainsRune(",]}: \t\n\r", rune(c.b[c.i])) {
		c.i++
	}
	return c.b[start:c.i]
}

// skip moves past the value at the cursor.
func (c *jsonCursor) skip() {
	switch c.peek() {
	case '"':
		c.str()
	case '[', '{':
		for depth := 0; ; {
			switch c.b[c.i] {
			case '"':
				c.str()
				continue
			case '[', '{':
				depth++
			case ']', '}':
				depth--
			}
			c.i++
			if depth == 0 {
				return
			}
		}
	default:
		c.literal()
	}
}

// textPart reads the object at the cursor and returns the length of its
// "text" string (the last "text" key wins, as when decoding into a map)
// and whether it has one.
func (c *jsonCursor) textPart() (n int, ok bool) {
	v := c.member("text", false)
	if len(v) == 0 || v[0] != '"' {
		return 0, false
	}
	return stringLen(v), true
}

// member reads the object at the cursor and returns the value of its last
// key name (up to case with fold), or nil.
func (c *jsonCursor) member(name string, fold bool) (v []byte) {
	c.i++ // '{'
	if c.peek() == '}' {
		c.i++
		return nil
	}
	for {
		key := c.str()
		c.peek()
		c.i++ // ':'
		start := c.i
		c.skip()
		if keyIs(key, name, fold) {
			v = bytes.TrimSpace(c.b[start:c.i])
		}
		if c.peek() == '}' {
			c.i++
			return v
		}
		c.i++ // ','
	}
}

// addMessages counts the content of a chat's messages (raw: valid JSON, not
// null), read in place: an array of objects (or nulls) whose "content" is
// matched as encoding/json matches a struct field, case aside.
func (pc *promptCount) addMessages(raw json.RawMessage) error {
	c := jsonCursor{b: raw}
	if c.peek() != '[' {
		return errors.New(`"messages" must be an array`)
	}
	c.i++
	if c.peek() == ']' {
		return nil
	}
	for i := 0; ; i++ {
		switch c.peek() {
		case '{':
			content := c.member("content", true)
			if !isAbsent(content) {
				// Valid JSON already (part of raw): no second check.
				if err := pc.value(&jsonCursor{b: content}, true, 0); err != nil {
					return fmt.Errorf("messages[%d].content: %v", i, err)
				}
			}
		case 'n':
			c.literal()
		default:
			return fmt.Errorf("messages[%d]: expected an object", i)
		}
		if c.peek() == ']' {
			return nil
		}
		c.i++ // ','
	}
}

// plainString reports whether the JSON string raw (quotes included) has no
// escape and is valid UTF-8: it then decodes to its bytes between quotes.
func plainString(raw []byte) bool {
	return bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw)
}

// stringLen is the length of the decoded JSON string raw (quotes included).
func stringLen(raw []byte) int {
	if plainString(raw) {
		return len(raw) - 2
	}
	var s string
	_ = json.Unmarshal(raw, &s) // valid: escapes and invalid UTF-8 decoded as encoding/json does
	return len(s)
}

// keyIs reports whether the JSON string raw decodes to key, or with fold
// to key up to case as encoding/json matches struct fields (key being
// ASCII without k or s, whose simple case folding is ASCII's).
func keyIs(raw []byte, key string, fold bool) bool {
	if !plainString(raw) {
		var s string
		_ = json.Unmarshal(raw, &s)
		return s == key || fold && strings.EqualFold(s, key)
	}
	raw = raw[1 : len(raw)-1]
	if len(raw) != len(key) {
		return false
	}
	for i := range raw {
		a, b := raw[i], key[i]
		if a != b && !(fold && a|0x20 == b|0x20 && 'a' <= b|0x20 && b|0x20 <= 'z') {
			return false
		}
	}
	return true
}

// checkNumber rejects a number a float64 cannot hold, as decoding it would.
func checkNumber(lit []byte) error {
	if len(lit) <= 15 && bytes.IndexAny(lit, ".eE") < 0 {
		return nil // an integer of at most 15 digits
	}
	if _, err := strconv.ParseFloat(string(lit), 64); err != nil {
		return fmt.Errorf("number %s does not fit a float64", lit)
	}
	return nil
}

// vocabulary of the simulated output; token i is vocabulary[i%len].
var vocabulary = [...]string{
	" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy",
	" dog", " while", " simulated", " tokens", " flow", " through", " sluice", ".",
}

func outputText(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		b.WriteString(vocabulary[i%len(vocabulary)])
	}
	return b.String()
}

// generation is one request in service.
type generation struct {
	rp      *Replica
	api     apiKind
	req     inferenceRequest
	seq     uint64
	created int64
	total   time.Duration // fixed/lognormal: drawn total service time
	cached  int           // prompt tokens found in the prefix cache

	prefilled bool // the prefill is done (and the prompt's blocks are stored)

	// kvHeld, when the KV capacity is on, points to the KV tokens the
	// request holds in the slot queue; run adds the generated tokens.
	kvHeld *int
	// dc is the request's decode clock on the prefill line (PrefillBlocksDecode).
	dc decodeClock

	// er is the request in the engine (LatencyEngine), and onAdmit is
	// called once it is admitted, before any token is emitted (seq and
	// cached are set then).
	er      *engineReq
	onAdmit func()

	// started: the stream's status and headers were sent: at once
	// (Config.StreamHeaders immediate, the default; seq and cached then
	// go out as trailers), or with the first token (set by stream).
	started bool
}

func (g *generation) id() string {
	prefix := "cmpl-"
	if g.api == apiChat {
		prefix = "chatcmpl-"
	}
	return prefix + g.rp.cfg.Name + "-" + strconv.FormatUint(g.seq, 10)
}

// run walks through the output in chunks of at most chunk tokens, waiting the
// modelled time before each chunk and then calling emit (if not nil).
//
// The prefill (prefillTime of the uncached prompt tokens) comes first. With
// the prefix cache off and no PrefillPerToken, it is folded into the first
// chunk's wait as it always was; otherwise it is waited for on its own and
// then the prompt's blocks are stored in the cache. With PrefillBlocksDecode
// the prefill waits for its turn on the replica's prefill line, and the
// decode waits pause while other requests prefill.
//
// With a KV capacity, the tokens of each chunk are added to the KV tokens
// the request holds once the chunk's wait is over (before emit).
func (g *generation) run(sl *sleeper, chunk int, emit func(from, to int) error) error {
	if g.er != nil {
		return g.runEngine(sl, chunk, emit)
	}
	l := g.rp.cfg.Latency
	n := g.req.OutputTokens
	if l.Kind != LatencyPerToken {
		g.total = g.rp.serviceTime()
	}
	prefill := g.prefill()
	pl := g.rp.pl
	if pl != nil && l.Kind == LatencyPerToken {
		if prefill > 0 {
			if err := pl.acquire(sl.ctx, sl.done); err != nil {
				return err
			}
			err := sl.sleep(prefill, nil)
			pl.release()
			if err != nil {
				return err
			}
		}
		prefill = 0
		g.prefilled = true
		if g.rp.cache != nil {
			g.rp.cache.store(g.req.Prefix)
		}
	} else if g.rp.cache != nil || (l.Kind != LatencyPerToken && prefill > 0) {
		if err := sl.sleep(prefill, nil); err != nil {
			return err
		}
		prefill = 0
		g.prefilled = true
		if g.rp.cache != nil {
			g.rp.cache.store(g.req.Prefix)
		}
	}
	for from := 0; from < n; {
		to := min(from+chunk, n)
		var d time.Duration
		steps := to - from
		if l.Kind == LatencyPerToken {
			// The first token comes right after prefill; the others are
			// spaced by the (batch-dependent) decode step.
			if from == 0 {
				d = prefill
				steps--
			}
			d += clampDuration(float64(g.rp.decodeStep()) * float64(steps))
		} else {
			// Spread the total evenly over the tokens.
			t := float64(g.total)
			d = time.Duration(t*float64(to)/float64(n)) - time.Duration(t*float64(from)/float64(n))
		}
		var err error
		if pl != nil && l.Kind == LatencyPerToken {
			err = pl.decodeWait(sl.sleep, &g.dc, d, steps)
		} else {
			err = sl.sleep(d, nil)
		}
		if err != nil {
			return err
		}
		if g.kvHeld != nil {
			g.rp.q.grow(to - from)
			*g.kvHeld += to - from
		}
		if emit != nil {
			if err := emit(from, to); err != nil {
				return err
			}
		}
		from = to
	}
	return nil
}

// prefill returns the request's prefill time, given its cached prompt tokens.
func (g *generation) prefill() time.Duration {
	return g.rp.prefillTime(g.req.PromptTokens, g.cached)
}

// usage is OpenAI's usage object.
// PromptTokensDetails is only set when the prefix cache is on.
type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (g *generation) usage() usage {
	u := usage{
		PromptTokens:     g.req.PromptTokens,
		CompletionTokens: g.req.OutputTokens,
		TotalTokens:      g.req.PromptTokens + g.req.OutputTokens,
	}
	if g.rp.cachesPrefixes() {
		u.PromptTokensDetails = &promptDetails{CachedTokens: g.cached}
	}
	return u
}

// Response bodies, as structs so that fields come out in the usual order
// and encoding stays cheap per streamed token.
type (
	openAIResponse struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices any    `json:"choices"` // []textChoice or []chatChoice
		Usage   *usage `json:"usage,omitempty"`
	}
	textChoice struct {
		Index        int       `json:"index"`
		Text         string    `json:"text"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason *string   `json:"finish_reason"`
	}
	chatMessage struct {
		Role    string `json:"role,omitempty"`
		Content string `json:"content"`
	}
	chatChoice struct {
		Index        int          `json:"index"`
		Message      *chatMessage `json:"message,omitempty"`
		Delta        *chatMessage `json:"delta,omitempty"`
		FinishReason *string      `json:"finish_reason"`
	}
	sglangResponse struct {
		Text     string     `json:"text"`
		MetaInfo sglangMeta `json:"meta_info"`
	}
	sglangMeta struct {
		ID               string        `json:"id"`
		PromptTokens     int           `json:"prompt_tokens"`
		CompletionTokens int           `json:"completion_tokens"`
		CachedTokens     *int          `json:"cached_tokens,omitempty"` // prefix cache on only
		FinishReason     *sglangFinish `json:"finish_reason"`
	}
	sglangFinish struct {
		Type   string `json:"type"`
		Length int    `json:"length"`
	}
)

var finishLength = "length"

func (g *generation) openAI(object string, choices any, u *usage) openAIResponse {
	return openAIResponse{ID: g.id(), Object: object, Created: g.created, Model: g.req.Model, Choices: choices, Usage: u}
}

func (g *generation) sglang(text string, done int) sglangResponse {
	r := sglangResponse{Text: text, MetaInfo: sglangMeta{
		ID: g.id(), PromptTokens: g.req.PromptTokens, CompletionTokens: done,
	}}
	if g.rp.cachesPrefixes() {
		r.MetaInfo.CachedTokens = &g.cached
	}
	if done == g.req.OutputTokens {
		r.MetaInfo.FinishReason = &sglangFinish{Type: "length", Length: done}
	}
	return r
}

// complete serves a non-streaming request.
func (g *generation) complete(w http.ResponseWriter, sl *sleeper) error {
	chunk := g.req.OutputTokens
	if g.rp.cfg.Latency.Kind == LatencyPerToken {
		// Re-evaluate the batch slowdown about eight times per request.
		chunk = max(1, (g.req.OutputTokens+7)/8)
	}
	if err := g.run(sl, chunk, nil); err != nil {
		return err
	}
	text := outputText(0, g.req.OutputTokens)
	u := g.usage()
	var body any
	switch g.api {
	case apiGenerate:
		body = g.sglang(text, g.req.OutputTokens)
	case apiChat:
		body = g.openAI("chat.completion", []chatChoice{{
			Message: &chatMessage{Role: "assistant", Content: text}, FinishReason: &finishLength,
		}}, &u)
	default:
		body = g.openAI("text_completion", []textChoice{{Text: text, FinishReason: &finishLength}}, &u)
	}
	writeJSON(w, http.StatusOK, body)
	return nil
}

// startStream sends a stream's status and headers, flushed.
func startStream(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := http.NewResponseController(w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return // the client is gone: the first write says so
	}
}

// stream serves a streaming request as server-sent events: the headers
// went out already (startStreamEarly, the default) or go out with the
// first chunk at the first token (first_token), one event per chunk, then
// "data: [DONE]".
func (g *generation) stream(w http.ResponseWriter, sl *sleeper) error {
	rc := http.NewResponseController(w)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	send := func(v any) error {
		if !g.started {
			startStream(w)
			g.started = true
		}
		buf.Reset()
		buf.WriteString("data: ")
		if s, ok := v.(string); ok {
			buf.WriteString(s + "\n\n")
		} else {
			if err := enc.Encode(v); err != nil { // Encode ends with "\n"
				return err
			}
			buf.WriteString("\n")
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	}
	n := g.req.OutputTokens
	err := g.run(sl, g.rp.cfg.StreamChunkTokens, func(from, to int) error {
		var finish *string
		if to == n {
			finish = &finishLength
		}
		switch g.api {
		case apiGenerate:
			// SGLang streams the cumulative text.
			return send(g.sglang(outputText(0, to), to))
		case apiChat:
			delta := &chatMessage{Content: outputText(from, to)}
			if from == 0 {
				delta.Role = "assistant"
			}
			return send(g.openAI("chat.completion.chunk", []chatChoice{{Delta: delta, FinishReason: finish}}, nil))
		default:
			return send(g.openAI("text_completion", []textChoice{{Text: outputText(from, to), FinishReason: finish}}, nil))
		}
	})
	if err != nil {
		if g.started && !errors.Is(err, errClosed) && sl.ctx.Err() == nil {
			// A write failed: the client is gone even if the context has not
			// noticed yet.
			return errClientGone
		}
		return err
	}
	if g.req.IncludeUsage && g.api != apiGenerate {
		object := "text_completion"
		if g.api == apiChat {
			object = "chat.completion.chunk"
		}
		u := g.usage()
		if err := send(g.openAI(object, []struct{}{}, &u)); err != nil {
			return errClientGone
		}
	}
	if err := send("[DONE]"); err != nil {
		return errClientGone
	}
	return nil
}

// errClientGone reports a failed write to the client.
var errClientGone = errors.New("sim: client went away")

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"type":"internal","message":"encoding the response failed"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// writeError answers with the project's JSON error shape
// {"error": {"type": ..., "message": ...}}.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"type": typ, "message": msg}})
}
