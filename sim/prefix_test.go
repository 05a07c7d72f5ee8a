package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// block returns a block of exactly n characters made of tag, so that
// blocks with different tags differ.
func block(tag string, n int) string {
	return strings.Repeat(tag, n/len(tag)+1)[:n]
}

func completionBody(prompt string) string {
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
	return string(b)
}

// cachedOf sends a completion and returns the X-Sim-Cached-Tokens header and
// the hit blocks of that request (from the Stats delta; requests are sent
// one at a time).
func (h *simHarness) cachedOf(path, body string) (cachedTokens int, hitBlocks uint64) {
	h.t.Helper()
	before := h.srv.Replica().Stats().PrefixHitBlocks
	r := h.do(context.Background(), http.MethodPost, path, body)
	if r.err != nil || r.status != http.StatusOK {
		h.t.Fatalf("request failed: status %d err %v body %s", r.status, r.err, r.body)
	}
	n, err := strconv.Atoi(r.header.Get(HeaderCachedTokens))
	if err != nil {
		h.t.Fatalf("bad %s header %q", HeaderCachedTokens, r.header.Get(HeaderCachedTokens))
	}
	return n, h.srv.Replica().Stats().PrefixHitBlocks - before
}

const bc = 16 // block chars in the tests

func TestPrefixCacheSharedPrefix(t *testing.T) {
	h := startSim(t, Config{PrefixCache: PrefixCache{Blocks: 64, BlockChars: bc}})
	shared := block("shared-system-prompt ", 8*bc) // 8 full blocks

	if c, hits := h.cachedOf("/v1/completions", completionBody(shared+block("first question ", 3*bc+5))); c != 0 || hits != 0 {
		t.Fatalf("cold cache: cached %d tokens, %d blocks", c, hits)
	}
	c, hits := h.cachedOf("/v1/completions", completionBody(shared+block("another question ", 2*bc+7)))
	if hits != 8 {
		t.Errorf("second request with the shared prefix hit %d blocks, want 8", hits)
	}
	// 128 of 167 characters cached; 41 prompt tokens (chars/4) × 128/167.
	if want := 41 * 128 / 167; c != want {
		t.Errorf("second request with the shared prefix has %d cached tokens, want %d", c, want)
	}
	if c, hits := h.cachedOf("/v1/completions", completionBody(block("unrelated text ", 10*bc))); c != 0 || hits != 0 {
		t.Errorf("different prefix: cached %d tokens, %d blocks, want none", c, hits)
	}

	// Chat: the same system message, different user messages.
	chat := func(user string) string {
		b, _ := json.Marshal(map[string]any{"messages": []map[string]any{
			{"role": "system", "content": block("you are a helpful simulated assistant ", 6*bc)},
			{"role": "user", "content": user},
		}})
		return string(b)
	}
	h.cachedOf("/v1/chat/completions", chat("what is a sluice?"))
	if _, hits := h.cachedOf("/v1/chat/completions", chat("and a lock?")); hits < 6 {
		t.Errorf("chat with the same system prompt hit %d blocks, want at least 6", hits)
	}
	// SGLang /generate text shares the completion prompt's rendering.
	if _, hits := h.cachedOf("/generate", `{"text":`+strconv.Quote(shared)+`}`); hits != 8 {
		t.Errorf("/generate with the shared prefix hit %d blocks, want 8", hits)
	}
}

func TestPrefixCacheKeysCoverWholePrefix(t *testing.T) {
	h := startSim(t, Config{PrefixCache: PrefixCache{Blocks: 64, BlockChars: bc}})
	x, z := block("X", bc), block("Z", bc)
	y := block("the same later text ", 4*bc)
	h.cachedOf("/v1/completions", completionBody(x+y))
	if c, hits := h.cachedOf("/v1/completions", completionBody(z+y)); c != 0 || hits != 0 {
		t.Errorf("same blocks after a different first block: cached %d tokens, %d blocks, want none", c, hits)
	}
	// A prompt that diverges in its third block hits the first two only.
	h.cachedOf("/v1/completions", completionBody(x+y[:bc]+block("Q", 3*bc)))
	if _, hits := h.cachedOf("/v1/completions", completionBody(x+y[:bc]+block("R", 3*bc))); hits != 2 {
		t.Errorf("prompts sharing two blocks: %d hit blocks, want 2", hits)
	}

	// The same at the unit level: block 1's key differs when block 0 does.
	a := newPromptPrefix([]byte(x+y), bc, 100)
	b := newPromptPrefix([]byte(z+y), bc, 100)
	if len(a.keys) != 5 || len(b.keys) != 5 {
		t.Fatalf("got %d and %d keys, want 5", len(a.keys), len(b.keys))
	}
	for i := range a.keys {
		if a.keys[i] == b.keys[i] {
			t.Errorf("block %d has the same key after different first blocks", i)
		}
	}
	if p := newPromptPrefix([]byte(x+y+"tail"), bc, 100); !equalKeys(p.keys, a.keys) || p.fullBlocks != 5 {
		t.Errorf("a partial last block changed the keys: %v vs %v", p.keys, a.keys)
	}
	if p := newPromptPrefix([]byte(x+y), bc, 3); len(p.keys) != 3 || p.fullBlocks != 5 {
		t.Errorf("keys are not capped at the capacity: %d keys, %d full blocks", len(p.keys), p.fullBlocks)
	}
}

func equalKeys(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPrefixCacheLRU(t *testing.T) {
	// Room for exactly two 4-block prompts.
	h := startSim(t, Config{PrefixCache: PrefixCache{Blocks: 8, BlockChars: bc}})
	a, b, c := block("A", 4*bc), block("B", 4*bc), block("C", 4*bc)
	h.cachedOf("/v1/completions", completionBody(a))
	h.cachedOf("/v1/completions", completionBody(b))
	if _, hits := h.cachedOf("/v1/completions", completionBody(a)); hits != 4 {
		t.Fatalf("A again hit %d blocks, want 4", hits)
	}
	// A was used after B, so C evicts B.
	h.cachedOf("/v1/completions", completionBody(c))
	if st := h.srv.Replica().Stats(); st.PrefixCachedBlocks != 8 || st.PrefixCapacityBlocks != 8 {
		t.Errorf("cache holds %d of %d blocks, want 8 of 8", st.PrefixCachedBlocks, st.PrefixCapacityBlocks)
	}
	if _, hits := h.cachedOf("/v1/completions", completionBody(a)); hits != 4 {
		t.Errorf("A (recently used) hit %d blocks after C, want 4", hits)
	}
	if _, hits := h.cachedOf("/v1/completions", completionBody(c)); hits != 4 {
		t.Errorf("C hit %d blocks, want 4", hits)
	}
	if _, hits := h.cachedOf("/v1/completions", completionBody(b)); hits != 0 {
		t.Errorf("B (least recently used) hit %d blocks after C, want 0 (evicted)", hits)
	}
}

func TestPrefixCacheEvictsTailFirst(t *testing.T) {
	c := newPrefixCache(3, bc)
	a := newPromptPrefix([]byte(block("A", 3*bc)), bc, 3)
	b := newPromptPrefix([]byte(block("B", bc)), bc, 3)
	c.store(a)
	c.store(b) // evicts A's last block, not its first
	if hit, _ := c.lookup(a, 12); hit != 2 {
		t.Errorf("A hit %d blocks after one eviction, want 2 (its tail block went first)", hit)
	}
	// Storing A again must not evict A's own blocks: it evicts B.
	c.store(a)
	if hit, _ := c.lookup(a, 12); hit != 3 {
		t.Errorf("A hit %d blocks after being stored again, want 3", hit)
	}
	if hit, _ := c.lookup(b, 4); hit != 0 {
		t.Errorf("B hit %d blocks, want 0", hit)
	}
	if st := c.stats(); st.blocks != 3 || st.queryBlocks != 3+3+1 || st.hitBlocks != 2+3 {
		t.Errorf("stats %+v", st)
	}
	// A prompt longer than the whole cache keeps its first blocks.
	long := newPromptPrefix([]byte(block("L", 5*bc)), bc, 3)
	c.store(long)
	if hit, _ := c.lookup(long, 20); hit != 3 {
		t.Errorf("long prompt hit %d blocks, want 3 (the capacity)", hit)
	}
}

func TestPrefixCacheCachedTokens(t *testing.T) {
	p := promptPrefix{textLen: 400, fullBlocks: 4}
	for _, c := range []struct{ hit, tokens, want int }{
		{0, 100, 0},
		{1, 100, 25},
		{2, 100, 50},
		{4, 100, 99}, // all cached: the last token is still computed
		{4, 1, 0},
	} {
		if got := p.cachedTokens(c.hit, 100, c.tokens); got != c.want {
			t.Errorf("cachedTokens(%d blocks, %d tokens) = %d, want %d", c.hit, c.tokens, got, c.want)
		}
	}
}

// newGeneration parses body as the replica would and looks its prefix up,
// as serveInference does when the request gets its slot.
func newGeneration(t *testing.T, rp *Replica, body string) *generation {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	req, _, err := rp.parseRequest(httptest.NewRecorder(), r)
	if err != nil {
		t.Fatal(err)
	}
	g := &generation{rp: rp, api: apiCompletions, req: req}
	if rp.cache != nil {
		_, g.cached = rp.cache.lookup(req.Prefix, req.PromptTokens)
	}
	return g
}

func TestPrefixCacheShortensPrefill(t *testing.T) {
	shared := block("a long shared document. ", 32*bc)
	first := completionBody(shared + block("question one ", 2*bc))
	second := completionBody(shared + block("question two ", 2*bc))

	for _, lat := range []Latency{
		{Kind: LatencyPerToken, Prefill: time.Microsecond, Decode: time.Microsecond},
		{Kind: LatencyFixed, Duration: time.Millisecond, PrefillPerToken: time.Microsecond},
		{Kind: LatencyLognormal, Duration: time.Millisecond, Sigma: 0.2, PrefillPerToken: time.Microsecond},
	} {
		t.Run(string(lat.Kind), func(t *testing.T) {
			h := startSim(t, Config{Latency: lat, PrefixCache: PrefixCache{Blocks: 256, BlockChars: bc}})
			rp := h.srv.Replica()

			cold := newGeneration(t, rp, second) // looked up before anything is cached
			if cold.cached != 0 {
				t.Fatalf("cold lookup found %d cached tokens", cold.cached)
			}
			want := time.Duration(cold.req.PromptTokens) * time.Microsecond
			if d := cold.prefill(); d != want {
				t.Errorf("cold prefill %v, want %v (1µs × %d prompt tokens)", d, want, cold.req.PromptTokens)
			}

			h.cachedOf("/v1/completions", first) // served: its blocks are now cached
			warm := newGeneration(t, rp, second)
			if warm.cached < 32*bc/4 {
				t.Fatalf("warm lookup found %d cached tokens, want at least %d", warm.cached, 32*bc/4)
			}
			want = time.Duration(warm.req.PromptTokens-warm.cached) * time.Microsecond
			if d := warm.prefill(); d != want || d >= cold.prefill() {
				t.Errorf("warm prefill %v, want %v (1µs × %d uncached tokens), shorter than cold %v",
					d, want, warm.req.PromptTokens-warm.cached, cold.prefill())
			}
		})
	}

	// Without a prefix cache the per_token prefill is charged for every
	// prompt token, as before.
	rp, err := New(Config{Latency: Latency{Kind: LatencyPerToken, Prefill: time.Microsecond}})
	if err != nil {
		t.Fatal(err)
	}
	g := newGeneration(t, rp, second)
	if d, want := g.prefill(), time.Duration(g.req.PromptTokens)*time.Microsecond; d != want {
		t.Errorf("prefill without a cache %v, want %v", d, want)
	}
}

func TestPrefixCacheMetricsAndStats(t *testing.T) {
	h := startSim(t, Config{Model: "llama", Concurrency: 8, PrefixCache: PrefixCache{Blocks: 100, BlockChars: bc}})
	shared := block("common prefix ", 10*bc)
	var wg sync.WaitGroup
	h.cachedOf("/v1/completions", completionBody(shared))
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := h.do(context.Background(), http.MethodPost, "/v1/completions", completionBody(shared+strconv.Itoa(i)+block("tail", 2*bc)))
			if r.status != 200 {
				t.Errorf("status %d", r.status)
			}
		}()
	}
	wg.Wait()
	rp := h.srv.Replica()
	st := rp.Stats()
	if st.PrefixQueries != st.PromptTokens {
		t.Errorf("queries %d tokens, want the %d prompt tokens of the served requests", st.PrefixQueries, st.PromptTokens)
	}
	if st.PrefixHitBlocks < 40*10 {
		t.Errorf("hit blocks %d, want at least 400 (10 per later request)", st.PrefixHitBlocks)
	}
	if st.PrefixHits == 0 || st.PrefixHits > st.PrefixQueries {
		t.Errorf("hits %d of %d queries", st.PrefixHits, st.PrefixQueries)
	}
	if got, want := st.HitRate(), float64(st.PrefixHits)/float64(st.PrefixQueries); got != want || got <= 0 || got >= 1 {
		t.Errorf("HitRate %v, want %v in (0, 1)", got, want)
	}
	if got := st.BlockHitRate(); got <= 0 || got > 1 {
		t.Errorf("BlockHitRate %v", got)
	}

	m := rp.MetricsText()
	kv := strconv.FormatFloat(float64(st.PrefixCachedBlocks)/100, 'g', -1, 64)
	for _, want := range []string{
		"# TYPE vllm:prefix_cache_queries_total counter\n",
		"# TYPE vllm:prefix_cache_hits_total counter\n",
		"# TYPE vllm:kv_cache_usage_perc gauge\n",
		`vllm:prefix_cache_queries_total{model_name="llama"} ` + strconv.FormatUint(st.PrefixQueries, 10) + "\n",
		`vllm:prefix_cache_hits_total{model_name="llama"} ` + strconv.FormatUint(st.PrefixHits, 10) + "\n",
		`vllm:kv_cache_usage_perc{model_name="llama"} ` + kv + "\n",
		`vllm:gpu_cache_usage_perc{model_name="llama"} 0` + "\n", // unchanged: running / concurrency
		`sim_prefix_cache_hit_blocks_total{replica="sim"} ` + strconv.FormatUint(st.PrefixHitBlocks, 10) + "\n",
		`sim_prefix_cache_capacity_blocks{replica="sim"} 100` + "\n",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}

	// usage reports the cached tokens, like vLLM's prompt_tokens_details.
	r := h.do(context.Background(), http.MethodPost, "/v1/completions", completionBody(shared))
	var body struct {
		Usage struct {
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || body.Usage.PromptTokensDetails == nil ||
		strconv.Itoa(body.Usage.PromptTokensDetails.CachedTokens) != r.header.Get(HeaderCachedTokens) {
		t.Errorf("usage lacks the cached tokens of header %q: %s", r.header.Get(HeaderCachedTokens), r.body)
	}
}

func TestPrefixCacheOffByDefault(t *testing.T) {
	h := startSim(t, Config{Model: "llama"})
	r := h.do(context.Background(), http.MethodPost, "/v1/completions", completionBody(block("x", 4096)))
	if r.status != 200 || r.header.Get(HeaderCachedTokens) != "" || strings.Contains(r.body, "cached_tokens") {
		t.Errorf("a replica without prefix cache reports cached tokens: %d %v %s", r.status, r.header, r.body)
	}
	st := h.srv.Replica().Stats()
	if st.PrefixQueries != 0 || st.PrefixHits != 0 || st.HitRate() != 0 || st.PrefixCapacityBlocks != 0 {
		t.Errorf("prefix stats without a cache: %+v", st)
	}
	m := h.srv.Replica().MetricsText()
	for _, want := range []string{
		`vllm:kv_cache_usage_perc{model_name="llama"} 0` + "\n",
		`vllm:prefix_cache_queries_total{model_name="llama"} 0` + "\n",
		`vllm:prefix_cache_hits_total{model_name="llama"} 0` + "\n",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}
}

func TestPrefixCacheBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{PrefixCache: PrefixCache{Blocks: -1}}, "PrefixCache.Blocks"},
		{Config{PrefixCache: PrefixCache{Blocks: MaxPrefixBlocks + 1}}, "PrefixCache.Blocks"},
		{Config{PrefixCache: PrefixCache{Blocks: 8, BlockChars: -1}}, "PrefixCache.BlockChars"},
		{Config{PrefixCache: PrefixCache{Blocks: 8, BlockChars: MaxBlockChars + 1}}, "PrefixCache.BlockChars"},
		{Config{PrefixCache: PrefixCache{BlockChars: 64}}, "PrefixCache.Blocks"},
		{Config{Latency: Latency{PrefillPerToken: -time.Millisecond}}, "Latency.PrefillPerToken"},
		{Config{Latency: Latency{Kind: LatencyPerToken, PrefillPerToken: time.Millisecond}}, "Latency.PrefillPerToken"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	rp, err := New(Config{PrefixCache: PrefixCache{Blocks: 8}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rp.Config().PrefixCache.BlockChars; got != DefaultBlockChars {
		t.Errorf("default BlockChars %d, want %d", got, DefaultBlockChars)
	}
}

// BenchmarkPrefixCache4KB measures the prefix cache's work per request for a
// 4 KB prompt: hashing its blocks, the lookup and the two stores.
func BenchmarkPrefixCache4KB(b *testing.B) {
	c := newPrefixCache(4096, DefaultBlockChars)
	prompts := make([][]byte, 100)
	for i := range prompts {
		prompts[i] = []byte(block(fmt.Sprintf("system prompt %d. ", i%10), 3072) + block(fmt.Sprintf("user %d ", i), 1024))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := newPromptPrefix(prompts[i%len(prompts)], DefaultBlockChars, 4096)
		c.lookup(p, 1024)
		c.store(p)
		c.store(p)
	}
}
