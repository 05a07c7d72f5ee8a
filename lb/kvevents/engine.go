package kvevents

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sluice-router/sluice/lb/reqtext"
)

// Prompt is what a PromptTokenizer gets of a request.
type Prompt struct {
	Model string
	// Text is the prompt as Sluice renders it (lb.Request.Text).
	Text string
	// Messages are a chat request's messages as sent (nil otherwise): the
	// engine renders them with its chat template before tokenizing.
	Messages []json.RawMessage
	// Replicas are the pool's replicas (dial addresses), any of which may
	// be asked.
	Replicas []string
}

// PromptTokenizer is a Tokenizer that knows the whole request. It returns
// the token ids of the prompt's beginning it knows now (all of them when
// it knows the whole prompt) and an estimate of the whole prompt's token
// count (at least len(tokens)); ok false when it knows none yet. It must
// not block: the pick waits for it.
type PromptTokenizer interface {
	TokenizePrompt(p Prompt) (tokens []uint32, total int, ok bool)
}

// EngineConfig bounds an EngineTokenizer. Zero values take the defaults.
type EngineConfig struct {
	// Path of the engines' tokenize endpoint (default /tokenize: vLLM,
	// SGLang and llm-d-inference-sim serve it there).
	Path string
	// Timeout of one tokenize request (default 2s).
	Timeout time.Duration
	// MaxEntries and MaxBytes bound the cache of tokenized prefixes
	// (default 4096 entries, 64 MiB counted as 4 bytes a token id plus
	// 128 an entry); the least recently used go first.
	MaxEntries int
	MaxBytes   int64
	// Concurrency bounds the tokenize requests in flight (default 4); a
	// miss that finds them all busy is not tokenized (counted).
	Concurrency int
	// CutBytes spaces the text cuts whose prefixes are cached (default
	// 256 bytes); MaxCuts bounds them per prompt (default 1024, so the
	// first 256 KiB of a prompt with the default spacing).
	CutBytes int
	MaxCuts  int
	// Margin: token ids dropped from the end of a cached prefix used for
	// a longer prompt, where the engine's tokenizer may merge across the
	// cut (default 8).
	Margin int
	// MaxAnswerBytes and MaxTokens bound an answer (default 8 MiB and
	// 524288 ids).
	MaxAnswerBytes int64
	MaxTokens      int
	// Backoff: a prefix whose tokenization failed is not asked again for
	// this long (default 5s).
	Backoff time.Duration
	// MaxAge: a cached answer older than this is asked again (of the next
	// replica in turn) when a prompt uses it, and serves until the new one
	// comes (default 10m).
	MaxAge time.Duration
	// Transport makes the requests (default a plain HTTP transport).
	Transport http.RoundTripper
	// BaseURL gives the base URL (scheme://host:port) of the replica at a
	// dial address, where Path is asked (nil: http://addr). A replica the
	// proxy reaches over TLS answers no plain-HTTP request.
	BaseURL func(addr string) string
}

// WithDefaults fills the zero fields.
func (c EngineConfig) WithDefaults() EngineConfig {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.Path == "" {
		c.Path = "/tokenize"
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	def(&c.MaxEntries, 4096)
	if c.MaxBytes <= 0 {
		c.MaxBytes = 64 << 20
	}
	def(&c.Concurrency, 4)
	def(&c.CutBytes, 256)
	def(&c.MaxCuts, 1024)
	def(&c.Margin, 8)
	if c.MaxAnswerBytes <= 0 {
		c.MaxAnswerBytes = 8 << 20
	}
	def(&c.MaxTokens, 1<<19)
	if c.Backoff <= 0 {
		c.Backoff = 5 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 10 * time.Minute
	}
	return c
}

// Reasons a tokenize answer was not used.
const (
	TokUnreachable = "unreachable" // no connection, or it broke
	TokTimeout     = "timeout"     // no whole answer within Timeout
	TokStatus      = "status"      // not 200
	TokTooLarge    = "too_large"   // answer over MaxAnswerBytes
	TokTooMany     = "too_many"    // more than MaxTokens ids
	TokBadAnswer   = "bad_answer"  // not {"tokens": [uint32...]}, count disagrees, or empty
	TokBusy        = "busy"        // Concurrency requests already in flight: not asked
	TokNoReplica   = "no_replica"  // every replica failed to answer lately: not asked
)

// EngineStats counts what an EngineTokenizer did.
type EngineStats struct {
	Hits       uint64            `json:"hits"`        // the whole prompt's tokens were cached
	PrefixHits uint64            `json:"prefix_hits"` // a cached prefix of it
	Misses     uint64            `json:"misses"`      // nothing cached: the tree decided
	Requests   uint64            `json:"requests"`    // tokenize requests sent
	Stored     uint64            `json:"stored"`      // answers cached
	Evicted    uint64            `json:"evicted"`     // entries dropped by the bounds
	Failures   map[string]uint64 `json:"failures,omitempty"`
	Entries    int               `json:"entries"`
	Bytes      int64             `json:"bytes"`
}

// Add adds o's counters and sizes to s.
func (s *EngineStats) Add(o EngineStats) {
	s.Hits += o.Hits
	s.PrefixHits += o.PrefixHits
	s.Misses += o.Misses
	s.Requests += o.Requests
	s.Stored += o.Stored
	s.Evicted += o.Evicted
	s.Entries += o.Entries
	s.Bytes += o.Bytes
	for r, n := range o.Failures {
		if s.Failures == nil {
			s.Failures = map[string]uint64{}
		}
		s.Failures[r] += n
	}
}

// EngineTokenizer asks the engines themselves (their /tokenize) for a
// prompt's token ids, so Sluice keys it exactly as the engine keys its
// blocks, whatever the model's tokenizer and chat template. It never makes
// the pick wait: it answers from a bounded cache, and on a miss starts the
// engine request in the background (the pick goes on without exact ids:
// the approximate tree decides) so the next request with the same prefix
// finds it.
//
// What is cached, and why it stays correct: a BPE tokenizer may merge
// across any cut of a text, so the ids of a text prefix are not a prefix
// of the whole text's ids near the cut. The cache holds whole tokenized
// texts: a completion prompt's prefixes cut every CutBytes bytes (on a
// rune boundary), a chat request's first k messages (k = 1..n, rendered
// by the engine). Keys hash exactly that text (or those messages' bytes)
// with the model. A prompt looks up its own cuts, longest first: the
// whole prompt's entry is its exact ids; a shorter prefix's entry is used
// without its last Margin ids (a cut splits at most the pre-token it falls
// in; merges do not reach further back). A wrong id there only makes a
// shorter match (block keys are chained: no replica holds a wrong chain),
// never a false hit on another prompt.
//
// On a miss it asks for the prompt's longest cut (its whole text when
// shorter than one cut; a chat request's whole conversation), so repeats
// and continuations (the next turn) hit; and for the longest cut an
// earlier prompt also had (a shared system prompt or document), so
// prompts that share only a prefix hit after the second one.
type EngineTokenizer struct {
	cfg    EngineConfig
	client *http.Client
	seed   maphash.Seed
	now    func() time.Time // time.Now; a test's clock
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}
	rr     atomic.Uint64

	mu      sync.Mutex
	closed  bool
	entries map[uint64]*list.Element // of *tokEntry
	lru     list.List                // front: most recently used
	bytes   int64
	pending map[uint64]struct{}
	seen    [2]map[uint64]struct{} // cuts of recent prompts, two generations
	down    map[string]time.Time   // replicas not asked until then (failed to answer)

	hits, prefixHits, misses, requests, stored, evicted atomic.Uint64
	failMu                                              sync.Mutex
	failures                                            map[string]uint64
}

type tokEntry struct {
	key    uint64
	tokens []uint32  // nil: failed, asked again after failedUntil
	at     time.Time // when tokens came (asked again after MaxAge)
	// failedUntil: the last request for it failed; not asked again
	// before (tokens, if any, still serve).
	failedUntil time.Time
}

const entryOverhead = 128

// seenMax bounds one generation of the seen cuts.
const seenMax = 1 << 16

// NewEngineTokenizer returns a tokenizer that asks the replicas it is
// given; Close stops its requests.
func NewEngineTokenizer(cfg EngineConfig) *EngineTokenizer {
	cfg = cfg.WithDefaults()
	tr := cfg.Transport
	if tr == nil {
		tr = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
			MaxIdleConnsPerHost: cfg.Concurrency,
			IdleConnTimeout:     30 * time.Second,
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &EngineTokenizer{
		cfg: cfg, client: &http.Client{Transport: tr, Timeout: cfg.Timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		seed: maphash.MakeSeed(), now: time.Now, ctx: ctx, cancel: cancel,
		sem:     make(chan struct{}, cfg.Concurrency),
		entries: map[uint64]*list.Element{}, pending: map[uint64]struct{}{}, down: map[string]time.Time{},
		seen:     [2]map[uint64]struct{}{{}, {}},
		failures: map[string]uint64{},
	}
	return e
}

// Close cancels the requests in flight and waits for them; later misses
// ask nothing.
func (e *EngineTokenizer) Close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
	if t, ok := e.client.Transport.(*http.Transport); ok && e.cfg.Transport == nil {
		t.CloseIdleConnections()
	}
}

// Tokenize implements Tokenizer from the cache alone (it knows no replica
// to ask).
func (e *EngineTokenizer) Tokenize(model, text string) ([]uint32, bool) {
	t, _, ok := e.TokenizePrompt(Prompt{Model: model, Text: text})
	return t, ok
}

// cut is one cacheable prefix of a prompt.
type cut struct {
	key   uint64
	end   int  // text bytes, or messages
	whole bool // the whole prompt
	size  int  // bytes covered (for the total estimate)
}

// cuts lists the prompt's cacheable prefixes, shortest first.
func (e *EngineTokenizer) cuts(p Prompt) []cut {
	var h maphash.Hash
	h.SetSeed(e.seed)
	_, _ = h.WriteString(p.Model)
	if p.Messages != nil {
		_ = h.WriteByte(0xfe)
		out := make([]cut, 0, min(len(p.Messages), e.cfg.MaxCuts))
		size := 0
		for i, m := range p.Messages {
			if i >= e.cfg.MaxCuts {
				break
			}
			var n [8]byte
			_, _ = h.Write(strconv.AppendInt(n[:0], int64(len(m)), 10))
			_ = h.WriteByte(':')
			_, _ = h.Write(m)
			size += len(m)
			// reqtext keeps the first MaxMessages of a longer conversation:
			// as many is not known to be the whole of it.
			whole := i+1 == len(p.Messages) && len(p.Messages) < reqtext.MaxMessages
			out = append(out, cut{key: h.Sum64(), end: i + 1, whole: whole, size: size})
		}
		return out
	}
	_ = h.WriteByte(0xff)
	text := p.Text
	if text == "" || len(text) > maxTokenizeBytes {
		return nil
	}
	out := make([]cut, 0, min(len(text)/e.cfg.CutBytes+1, e.cfg.MaxCuts))
	prev := 0
	for at := e.cfg.CutBytes; at < len(text) && len(out) < e.cfg.MaxCuts; at += e.cfg.CutBytes {
		end := at
		for end > prev && !utf8.RuneStart(text[end]) { // valid UTF-8: decided by text[:at]
			end--
		}
		if end == prev {
			continue
		}
		_, _ = h.WriteString(text[prev:end])
		prev = end
		out = append(out, cut{key: h.Sum64(), end: end, size: end})
	}
	if len(out) < e.cfg.MaxCuts {
		_, _ = h.WriteString(text[prev:])
		out = append(out, cut{key: h.Sum64(), end: len(text), whole: true, size: len(text)})
	}
	return out
}

// TokenizePrompt implements PromptTokenizer.
func (e *EngineTokenizer) TokenizePrompt(p Prompt) ([]uint32, int, bool) {
	cs := e.cuts(p)
	if len(cs) == 0 {
		return nil, 0, false
	}
	fullSize := cs[len(cs)-1].size
	if !cs[len(cs)-1].whole {
		fullSize = len(p.Text)
	}
	now := e.now()
	hit := -1
	stale := false
	var tokens []uint32
	var ask []asked
	e.mu.Lock()
	for i := len(cs) - 1; i >= 0; i-- {
		if el, ok := e.entries[cs[i].key]; ok && el.Value.(*tokEntry).tokens != nil {
			en := el.Value.(*tokEntry)
			hit, tokens = i, en.tokens
			stale = now.Sub(en.at) >= e.cfg.MaxAge
			e.lru.MoveToFront(el)
			break
		}
	}
	if len(p.Replicas) > 0 && !e.closed {
		// Its own longest reusable cut: the whole conversation, or the
		// longest text cut (the whole text when it has no other).
		own := len(cs) - 1
		if p.Messages == nil && own > 0 && cs[own].whole {
			own--
		}
		var want []int
		if own > hit {
			want = append(want, own)
		}
		// An old answer is asked again (of the next replica in turn):
		// one replica's wrong answer serves every replica's requests, so
		// it must not stay for good.
		if stale {
			want = append(want, hit)
		}
		// The longest cut an earlier prompt had too.
		for i := len(cs) - 1; i > hit; i-- {
			if e.wasSeen(cs[i].key) {
				if i != own {
					want = append(want, i)
				}
				break
			}
		}
		for _, c := range cs {
			e.see(c.key)
		}
		ask = e.claim(cs, want, p.Replicas, now)
	}
	e.mu.Unlock()
	for _, a := range ask {
		e.fetch(p, cs[a.cut], a.addr)
	}
	switch {
	case hit < 0:
		e.misses.Add(1)
		return nil, 0, false
	case cs[hit].whole:
		e.hits.Add(1)
		return tokens, len(tokens), true
	}
	e.prefixHits.Add(1)
	tokens = tokens[:max(0, len(tokens)-e.cfg.Margin)]
	total := len(tokens)
	if cs[hit].size > 0 {
		total = max(total, int(int64(len(tokens))*int64(fullSize)/int64(cs[hit].size)))
	}
	return tokens, total, len(tokens) > 0
}

func (e *EngineTokenizer) wasSeen(k uint64) bool {
	_, a := e.seen[0][k]
	_, b := e.seen[1][k]
	return a || b
}

func (e *EngineTokenizer) see(k uint64) {
	if len(e.seen[0]) >= seenMax {
		e.seen[1], e.seen[0] = e.seen[0], make(map[uint64]struct{}, seenMax/4)
	}
	e.seen[0][k] = struct{}{}
}

// asked is one cut to ask for, and the replica to ask.
type asked struct {
	cut  int
	addr string
}

// replica picks the next replica to ask, in turn, skipping those that
// failed to answer within Backoff; "" when all did. Called with e.mu held.
func (e *EngineTokenizer) replica(replicas []string, now time.Time) string {
	start := e.rr.Add(1)
	for j := range replicas {
		addr := replicas[int((start+uint64(j))%uint64(len(replicas)))]
		if until, ok := e.down[addr]; ok {
			if now.Before(until) {
				continue
			}
			delete(e.down, addr)
		}
		return addr
	}
	return ""
}

// claim keeps the cuts to ask for that are not pending nor backing off,
// with a replica to ask, and marks them pending. Called with e.mu held.
func (e *EngineTokenizer) claim(cs []cut, want []int, replicas []string, now time.Time) []asked {
	var out []asked
	for _, i := range want {
		k := cs[i].key
		if _, ok := e.pending[k]; ok {
			continue
		}
		if el, ok := e.entries[k]; ok && now.Before(el.Value.(*tokEntry).failedUntil) {
			continue
		}
		addr := e.replica(replicas, now)
		if addr == "" {
			e.fail(TokNoReplica)
			continue
		}
		select {
		case e.sem <- struct{}{}:
		default:
			e.fail(TokBusy)
			continue
		}
		e.pending[k] = struct{}{}
		e.wg.Add(1)
		out = append(out, asked{cut: i, addr: addr})
	}
	return out
}

// fetch asks one replica for the cut's tokens in the background (its slot
// and pending mark were taken by claim).
func (e *EngineTokenizer) fetch(p Prompt, c cut, addr string) {
	body := tokenizeBody(p, c)
	go func() {
		defer e.wg.Done()
		defer func() { <-e.sem }()
		e.requests.Add(1)
		tokens, reason := e.ask(addr, body)
		e.mu.Lock()
		defer e.mu.Unlock()
		delete(e.pending, c.key)
		if e.closed {
			return
		}
		if reason != "" {
			e.fail(reason)
			until := e.now().Add(e.cfg.Backoff)
			if el, ok := e.entries[c.key]; ok && el.Value.(*tokEntry).tokens != nil {
				el.Value.(*tokEntry).failedUntil = until // a refresh: the old answer serves on
			} else {
				e.put(&tokEntry{key: c.key, failedUntil: until})
			}
			if reason == TokUnreachable || reason == TokTimeout {
				if len(e.down) >= 4096 { // bounded: only replicas of the pool get here
					clear(e.down)
				}
				e.down[addr] = until // asked no more until then; the others are
			}
			return
		}
		e.stored.Add(1)
		e.put(&tokEntry{key: c.key, tokens: tokens, at: e.now()})
	}()
}

// tokenizeBody is the request: vLLM's (and the sim's) shape, a prompt or
// messages; SGLang takes the prompt one.
func tokenizeBody(p Prompt, c cut) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	if p.Model != "" {
		m, _ := json.Marshal(p.Model)
		b.WriteString(`"model":`)
		b.Write(m)
		b.WriteByte(',')
	}
	if p.Messages != nil {
		b.WriteString(`"messages":[`)
		for i, m := range p.Messages[:c.end] {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(m)
		}
		b.WriteString(`]}`)
		return b.Bytes()
	}
	s, _ := json.Marshal(p.Text[:c.end])
	b.WriteString(`"prompt":`)
	b.Write(s)
	b.WriteByte('}')
	return b.Bytes()
}

var errTooLarge = errors.New("answer too large")

// ask sends one tokenize request and validates the answer; reason is ""
// when tokens are good.
func (e *EngineTokenizer) ask(addr string, body []byte) (tokens []uint32, reason string) {
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.baseURL(addr)+e.cfg.Path, bytes.NewReader(body))
	if err != nil {
		return nil, TokUnreachable
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		if isTimeout(ctx, err) {
			return nil, TokTimeout
		}
		return nil, TokUnreachable
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, TokStatus
	}
	raw, err := readBounded(resp.Body, e.cfg.MaxAnswerBytes)
	switch {
	case errors.Is(err, errTooLarge):
		return nil, TokTooLarge
	case err != nil && isTimeout(ctx, err):
		return nil, TokTimeout
	case err != nil:
		return nil, TokUnreachable
	}
	return parseTokenizeAnswer(raw, e.cfg.MaxTokens)
}

// baseURL is where the replica at addr is asked.
func (e *EngineTokenizer) baseURL(addr string) string {
	if e.cfg.BaseURL != nil {
		return e.cfg.BaseURL(addr)
	}
	return "http://" + addr
}

func isTimeout(ctx context.Context, err error) bool {
	var ne net.Error
	return errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func readBounded(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, errTooLarge
	}
	return b, nil
}

// parseTokenizeAnswer reads {"tokens": [ids], "count": n, ...}: ids are
// integers in uint32, count (when given) is their number, and there is at
// least one.
func parseTokenizeAnswer(raw []byte, maxTokens int) ([]uint32, string) {
	var a struct {
		Tokens json.RawMessage `json:"tokens"`
		Count  *int64          `json:"count"`
	}
	if err := json.Unmarshal(raw, &a); err != nil || len(a.Tokens) == 0 || a.Tokens[0] != '[' {
		return nil, TokBadAnswer
	}
	// Count the elements before decoding them: a huge list is refused
	// without building it, and the list is decoded into a slice of its
	// size (json's growth left up to twice the room, held by the cache
	// but not counted in its bytes).
	n := bytes.Count(a.Tokens, []byte{','}) + 1
	if n > maxTokens+1 {
		return nil, TokTooMany
	}
	// A null decodes as id 0 (json leaves the element zero): not an id.
	if bytes.IndexByte(a.Tokens, 'n') >= 0 {
		return nil, TokBadAnswer
	}
	tokens := make([]uint32, 0, n)
	if err := json.Unmarshal(a.Tokens, &tokens); err != nil {
		return nil, TokBadAnswer
	}
	switch {
	case len(tokens) > maxTokens:
		return nil, TokTooMany
	case len(tokens) == 0, a.Count != nil && *a.Count != int64(len(tokens)):
		return nil, TokBadAnswer
	}
	return tokens, ""
}

// put caches en (replacing the key's entry) and applies the bounds.
// Called with e.mu held.
func (e *EngineTokenizer) put(en *tokEntry) {
	if el, ok := e.entries[en.key]; ok {
		e.bytes -= entryBytes(el.Value.(*tokEntry))
		e.lru.Remove(el)
		delete(e.entries, en.key)
	}
	size := entryBytes(en)
	if size > e.cfg.MaxBytes {
		e.evicted.Add(1)
		return
	}
	e.entries[en.key] = e.lru.PushFront(en)
	e.bytes += size
	for len(e.entries) > e.cfg.MaxEntries || e.bytes > e.cfg.MaxBytes {
		el := e.lru.Back()
		old := el.Value.(*tokEntry)
		e.lru.Remove(el)
		delete(e.entries, old.key)
		e.bytes -= entryBytes(old)
		e.evicted.Add(1)
	}
}

func entryBytes(en *tokEntry) int64 { return int64(4*cap(en.tokens) + entryOverhead) }

func (e *EngineTokenizer) fail(reason string) {
	e.failMu.Lock()
	e.failures[reason]++
	e.failMu.Unlock()
}

// Stats returns a snapshot of the counters and the cache's size.
func (e *EngineTokenizer) Stats() EngineStats {
	s := EngineStats{Hits: e.hits.Load(), PrefixHits: e.prefixHits.Load(), Misses: e.misses.Load(),
		Requests: e.requests.Load(), Stored: e.stored.Load(), Evicted: e.evicted.Load(),
		Failures: map[string]uint64{}}
	e.failMu.Lock()
	for r, n := range e.failures {
		s.Failures[r] = n
	}
	e.failMu.Unlock()
	e.mu.Lock()
	s.Entries, s.Bytes = len(e.entries), e.bytes
	e.mu.Unlock()
	return s
}

// String names the tokenizer in logs.
func (e *EngineTokenizer) String() string {
	return fmt.Sprintf("engine %s (timeout %s)", e.cfg.Path, e.cfg.Timeout)
}
