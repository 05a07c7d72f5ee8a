package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// engineConfig is a small engine for tests: blocks of 16 tokens (64
// characters of prompt text).
func engineConfig(base, perToken time.Duration) Config {
	return Config{
		Concurrency:    8,
		KVBlocks:       64,
		BlockTokens:    16,
		MaxBatchTokens: 4096,
		Latency:        Latency{Kind: LatencyEngine, StepBase: base, StepPerToken: perToken},
	}
}

// enginePrompt is a completion body whose prompt is tokens tokens (4
// characters each) starting with lead, so that prompts with different
// leads share no block.
func enginePrompt(lead byte, tokens, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"prompt":     string(lead) + strings.Repeat("abcd", tokens)[1:],
		"max_tokens": maxTokens,
		"stream":     stream,
	})
	return string(b)
}

// engineDirect is an engine driven by hand (no loop), for the scheduler's
// arithmetic.
func engineDirect(cfg Config) *engine {
	cfg = cfg.withDefaults()
	return newEngine(cfg, make(chan struct{}))
}

func TestEngineStepPlan(t *testing.T) {
	cfg := engineConfig(0, 0)
	cfg.Concurrency = 2
	cfg.MaxBatchTokens = 150
	e := engineDirect(cfg)
	var rs []*engineReq
	for i := range 3 {
		r, fits := e.newRequest(100, 4, newPromptPrefix([]byte(strings.Repeat(string(rune('a'+i)), 400)), 64, 64))
		if !fits {
			t.Fatal("request does not fit")
		}
		r.elem = e.waiting.PushBack(r)
		rs = append(rs, r)
	}
	// Step 1: r0 is admitted and prefills 100, r1 is admitted and prefills
	// the 50 tokens left of the budget, r2 waits (2 sequences at most).
	work, tokens, _ := e.planLocked(nil, time.Time{})
	if tokens != 150 || len(work) != 2 || work[0].n != 100 || work[1].n != 50 {
		t.Fatalf("step 1: %d tokens, work %+v", tokens, work)
	}
	if e.waiting.Len() != 1 || len(e.running) != 2 {
		t.Fatalf("step 1: waiting %d, running %d", e.waiting.Len(), len(e.running))
	}
	e.applyLocked(work)
	if rs[0].generated != 1 || rs[1].generated != 0 || rs[1].left != 50 {
		t.Fatalf("after step 1: r0 %d tokens, r1 %d tokens %d left", rs[0].generated, rs[1].generated, rs[1].left)
	}
	// Step 2: r0 decodes first, then r1's prefill continues.
	work, tokens, _ = e.planLocked(work[:0], time.Time{})
	if tokens != 51 || !work[0].decode || work[0].r != rs[0] || work[1].n != 50 {
		t.Fatalf("step 2: %d tokens, work %+v", tokens, work)
	}
	e.applyLocked(work)
	// Steps 3, 4: both decode; r0 ends after its 4th token and frees its seat.
	for step := 3; step <= 4; step++ {
		work, tokens, _ = e.planLocked(work[:0], time.Time{})
		if tokens != 2 {
			t.Fatalf("step %d: %d tokens, want 2 decodes", step, tokens)
		}
		e.applyLocked(work)
	}
	if rs[0].state != reqDone || rs[0].generated != 4 {
		t.Fatalf("r0 state %d, %d tokens", rs[0].state, rs[0].generated)
	}
	// Step 5: r1 decodes, r2 is admitted into the freed seat.
	work, tokens, _ = e.planLocked(work[:0], time.Time{})
	if tokens != 101 || e.waiting.Len() != 0 {
		t.Fatalf("step 5: %d tokens, waiting %d", tokens, e.waiting.Len())
	}
}

// TestEngineStepContext checks the context a step's tokens attend to:
// a prefill chunk's context is the request's tokens up to the chunk's end
// (its cached prefix included), a decode's its prompt and output so far.
func TestEngineStepContext(t *testing.T) {
	cfg := engineConfig(0, 0)
	cfg.MaxBatchTokens = 150
	e := engineDirect(cfg)
	text := []byte(strings.Repeat("a", 400)) // 100 tokens, 6 full blocks of 64 characters
	add := func() *engineReq {
		r, fits := e.newRequest(100, 4, newPromptPrefix(text, 64, 64))
		if !fits {
			t.Fatal("request does not fit")
		}
		r.since = time.Now()
		r.elem = e.waiting.PushBack(r)
		return r
	}
	add() // r0
	work, tokens, context := e.planLocked(nil, time.Time{})
	if tokens != 100 || context != 100 {
		t.Fatalf("step 1 (r0 prefills 100): %d tokens, context %d; want 100, 100", tokens, context)
	}
	e.applyLocked(work)
	// r1 shares r0's 6 blocks (96 tokens) and prefills 4: its chunk attends
	// to all 100; r0 decodes its 2nd token over 100 + 1.
	r1 := add()
	work, tokens, context = e.planLocked(work[:0], time.Time{})
	if r1.cached != 96 || tokens != 1+4 || context != 101+100 {
		t.Fatalf("step 2: r1 cached %d, %d tokens, context %d; want 96, 5, 201", r1.cached, tokens, context)
	}
	e.applyLocked(work)
	work, tokens, context = e.planLocked(work[:0], time.Time{})
	if tokens != 2 || context != 102+101 {
		t.Fatalf("step 3 (two decodes): %d tokens, context %d; want 2, 203", tokens, context)
	}
}

// TestEngineAsyncSchedulingAdmitsLater checks AsyncScheduling's plan: the
// step after the one in flight admits only the requests that had arrived
// when that step started, unless it would have nothing to run.
func TestEngineAsyncSchedulingAdmitsLater(t *testing.T) {
	cfg := engineConfig(0, 0)
	cfg.Latency.AsyncScheduling = true
	e := engineDirect(cfg)
	start := time.Now()
	add := func(lead byte, since time.Time) *engineReq {
		r, fits := e.newRequest(10, 3, newPromptPrefix([]byte(strings.Repeat(string(lead), 40)), 64, 64))
		if !fits {
			t.Fatal("request does not fit")
		}
		r.since = since
		r.elem = e.waiting.PushBack(r)
		return r
	}
	a := add('a', start)
	// Nothing in flight: a is admitted at once.
	work, _, _ := e.planStepLocked(nil, time.Time{})
	if len(work) != 1 || work[0].r != a {
		t.Fatalf("first plan: %+v", work)
	}
	e.applyLocked(work)
	// b arrives while the step that started at start+1ms runs: the next
	// plan, made when that step started, decodes a and leaves b waiting.
	inFlight := start.Add(time.Millisecond)
	b := add('b', inFlight.Add(time.Millisecond))
	work, _, _ = e.planStepLocked(work[:0], inFlight)
	if len(work) != 1 || work[0].r != a || b.state != reqWaiting {
		t.Fatalf("plan behind the step in flight: %+v, b state %d; want a's decode alone, b waiting", work, b.state)
	}
	e.applyLocked(work)
	// The step after that was planned once b had arrived: b is admitted.
	work, _, _ = e.planStepLocked(work[:0], b.since.Add(time.Millisecond))
	if len(work) != 2 || b.state != reqRunning {
		t.Fatalf("next plan: %+v, b state %d; want a's decode and b's prefill", work, b.state)
	}
	e.applyLocked(work)
	// Without async scheduling the same arrival is admitted at once.
	cfg.Latency.AsyncScheduling = false
	e = engineDirect(cfg)
	a = add('a', start)
	work, _, _ = e.planStepLocked(nil, time.Time{})
	e.applyLocked(work)
	b = add('b', inFlight.Add(time.Millisecond))
	work, _, _ = e.planStepLocked(work[:0], inFlight)
	if len(work) != 2 || b.state != reqRunning {
		t.Fatalf("synchronous plan: %+v, b state %d; want a's decode and b's prefill", work, b.state)
	}
	// An idle engine plans at once: c, arrived after the step in flight
	// started, is admitted because nothing else would run.
	cfg.Latency.AsyncScheduling = true
	e = engineDirect(cfg)
	c := add('c', inFlight.Add(time.Millisecond))
	work, _, _ = e.planStepLocked(nil, inFlight)
	if len(work) != 1 || work[0].r != c {
		t.Fatalf("idle async plan: %+v; want c's prefill", work)
	}
}

// TestEngineStepTimeWithContext checks the step time with a cost per
// context token: a prefill of 100 and four decodes attend to 100, 101,
// 102, 103 and 104 tokens.
func TestEngineStepTimeWithContext(t *testing.T) {
	const base, per, perCtx = 2 * time.Millisecond, 50 * time.Microsecond, time.Microsecond
	cfg := engineConfig(base, per)
	cfg.Latency.StepPerContextToken = perCtx
	h := startSim(t, cfg)
	rp := h.srv.Replica()
	r := h.do(context.Background(), http.MethodPost, "/v1/completions", enginePrompt('a', 100, 5, false))
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	st := rp.Stats()
	want := 5*base + 104*per + (100+101+102+103+104)*perCtx
	if st.Steps != 5 || st.Busy != want {
		t.Errorf("steps %d, busy %v; want 5, %v", st.Steps, st.Busy, want)
	}
}

func TestEngineStepTimeFollowsFormula(t *testing.T) {
	const base, per = 2 * time.Millisecond, 50 * time.Microsecond
	h := startSim(t, engineConfig(base, per))
	rp := h.srv.Replica()
	start := time.Now()
	r := h.do(context.Background(), http.MethodPost, "/v1/completions", enginePrompt('a', 100, 5, false))
	elapsed := time.Since(start)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	st := rp.Stats()
	// One step prefills the 100 prompt tokens (and yields the first
	// token), four steps decode one token each.
	if st.Steps != 5 || st.PrefillTokens != 100 || st.DecodeTokens != 4 || st.MaxStepTokens != 100 {
		t.Fatalf("steps %d, prefill %d, decode %d, max step %d; want 5, 100, 4, 100",
			st.Steps, st.PrefillTokens, st.DecodeTokens, st.MaxStepTokens)
	}
	want := (base + 100*per) + 4*(base+per)
	if st.Busy != want {
		t.Errorf("busy %v, want %v = (base + 100 × per token) + 4 × (base + per token)", st.Busy, want)
	}
	if tps := st.TokensPerStep(); tps != 104.0/5 {
		t.Errorf("tokens per step %v, want %v", tps, 104.0/5)
	}
	if elapsed < want {
		t.Errorf("answered after %v, before the steps' %v", elapsed, want)
	}
	if st.Running != 0 || st.KVBlocksUsed != 0 || st.KVBlocksCached != 6 {
		// 100 prompt tokens = 6 full blocks of 16, cached after the request.
		t.Errorf("after: running %d, blocks used %d, cached %d", st.Running, st.KVBlocksUsed, st.KVBlocksCached)
	}
}

// streamTimes reads an SSE stream and returns the arrival time of each
// token event.
func streamTimes(t *testing.T, h *simHarness, ctx context.Context, body string, first chan<- struct{}) []time.Time {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL()+"/v1/completions", strings.NewReader(body))
	resp, err := h.client.Do(req)
	if err != nil {
		t.Errorf("stream: %v", err)
		return nil
	}
	defer resp.Body.Close()
	var times []time.Time
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "data: {") {
			times = append(times, time.Now())
			if len(times) == 1 && first != nil {
				close(first)
			}
		}
	}
	return times
}

func TestEnginePrefillStallsDecodes(t *testing.T) {
	// Decode steps of ~1 ms; a 4,000-token prompt makes one step of
	// ≥ 400 ms, and every running stream waits for it.
	const base, per = time.Millisecond, 100 * time.Microsecond
	cfg := engineConfig(base, per)
	cfg.KVBlocks = 512
	h := startSim(t, cfg)
	rp := h.srv.Replica()
	first := make(chan struct{})
	done := make(chan []time.Time, 1)
	go func() { done <- streamTimes(t, h, context.Background(), enginePrompt('a', 10, 1000, true), first) }()
	<-first
	long := h.goDo(context.Background(), "/v1/completions", enginePrompt('b', 4000, 1, false))
	if r := recv(t, long); r.status != http.StatusOK {
		t.Fatalf("long prompt: %d %s", r.status, r.body)
	}
	times := <-done
	if len(times) != 1000 {
		t.Fatalf("stream got %d tokens, want 1000", len(times))
	}
	var maxGap time.Duration
	for i := 1; i < len(times); i++ {
		maxGap = max(maxGap, times[i].Sub(times[i-1]))
	}
	// The long prefill's step, with the stream's decode, lasts ≥ 401 ms
	// against ~1 ms for the others; half of it leaves room for a late
	// delivery of the token before.
	stall := base + 4001*per
	if maxGap < stall/2 {
		t.Errorf("largest gap between the stream's tokens %v, want about the long prefill's step %v", maxGap, stall)
	}
	if st := rp.Stats(); st.MaxStepTokens < 4001 {
		t.Errorf("max step tokens %d, want the prefill and a decode in one step (≥ 4001)", st.MaxStepTokens)
	}
}

func TestEngineAdmissionWaitsForKVBlocksFIFO(t *testing.T) {
	cfg := engineConfig(20*time.Millisecond, 0)
	cfg.KVBlocks = 10 // each request below needs 5 blocks: (64 + 16) / 16
	h := startSim(t, cfg)
	rp := h.srv.Replica()
	var results []<-chan simResult
	for i := range 5 {
		// Different leads: no shared blocks.
		results = append(results, h.goDo(context.Background(), "/v1/completions", enginePrompt(byte('a'+i), 64, 16, false)))
		waitFor(t, "request queued", func() bool { st := rp.Stats(); return st.Started+uint64(st.Waiting) == uint64(i+1) })
	}
	waitFor(t, "KV-bound batch", func() bool { st := rp.Stats(); return st.MaxRunning == 2 && st.MaxWaiting >= 3 })
	for i, ch := range results {
		if seq := seqOf(t, recv(t, ch)); seq != i+1 {
			t.Errorf("request %d admitted %d-th, want FIFO", i+1, seq)
		}
	}
	st := rp.Stats()
	if st.MaxRunning != 2 || st.MaxKVBlocksUsed != 10 {
		t.Errorf("max running %d, max blocks %d; want 2 (KV-bound) and 10", st.MaxRunning, st.MaxKVBlocksUsed)
	}
	metrics := rp.MetricsText()
	if !strings.Contains(metrics, `vllm:kv_cache_usage_perc{model_name="sim-model"} 0`+"\n") {
		t.Errorf("idle KV usage not 0:\n%s", metrics)
	}
}

func TestEngineTooLargeIsRejected(t *testing.T) {
	cfg := engineConfig(0, 0)
	cfg.KVBlocks = 4
	h := startSim(t, cfg)
	r := h.do(context.Background(), http.MethodPost, "/v1/completions", enginePrompt('a', 64, 16, false))
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "KV blocks") {
		t.Fatalf("status %d body %s, want 400 naming the KV blocks", r.status, r.body)
	}
}

func TestEnginePrefixHitsSkipPrefill(t *testing.T) {
	h := startSim(t, engineConfig(time.Millisecond, 0))
	rp := h.srv.Replica()
	body := enginePrompt('a', 100, 2, false) // 100 tokens: 6 full blocks
	first := h.do(context.Background(), http.MethodPost, "/v1/completions", body)
	second := h.do(context.Background(), http.MethodPost, "/v1/completions", body)
	if first.header.Get(HeaderCachedTokens) != "0" || second.header.Get(HeaderCachedTokens) != "96" {
		t.Fatalf("cached tokens %q then %q, want 0 then 96 (6 blocks of 16)",
			first.header.Get(HeaderCachedTokens), second.header.Get(HeaderCachedTokens))
	}
	if !strings.Contains(second.body, `"cached_tokens":96`) {
		t.Errorf("usage lacks the cached tokens: %s", second.body)
	}
	st := rp.Stats()
	if st.PrefillTokens != 100+4 || st.PrefixHits != 96 || st.PrefixQueries != 200 {
		t.Errorf("prefill %d tokens, hits %d / %d; want 104, 96 / 200", st.PrefillTokens, st.PrefixHits, st.PrefixQueries)
	}
	// A prompt that is all cached still computes its last token.
	exact := enginePrompt('a', 96, 2, false)
	r := h.do(context.Background(), http.MethodPost, "/v1/completions", exact)
	if got := r.header.Get(HeaderCachedTokens); got != "80" {
		t.Errorf("96-token prompt with 6 cached blocks: cached %s, want 80 (the last block is recomputed)", got)
	}
}

func TestEngineConcurrentPrefixSharing(t *testing.T) {
	// Requests with the same prompt arriving while the first one runs
	// share its blocks once they are registered: the batch fits although
	// the KV cache could not hold every prompt privately.
	cfg := engineConfig(2*time.Millisecond, 0)
	// A 160-token prompt + 16 = 11 blocks, of which 9 can be hits (the
	// last prompt token is computed): the first request holds 11, the
	// second 2 more, the third waits.
	cfg.KVBlocks = 13
	h := startSim(t, cfg)
	rp := h.srv.Replica()
	body := enginePrompt('a', 160, 16, false)
	var results []<-chan simResult
	for range 3 {
		results = append(results, h.goDo(context.Background(), "/v1/completions", body))
	}
	for _, ch := range results {
		if r := recv(t, ch); r.status != http.StatusOK {
			t.Fatalf("status %d %s", r.status, r.body)
		}
	}
	if st := rp.Stats(); st.MaxRunning < 2 {
		t.Errorf("max running %d: the shared prompt did not let requests run together", st.MaxRunning)
	}
}

func TestEngineCancelFreesBlocks(t *testing.T) {
	cfg := engineConfig(5*time.Millisecond, 0)
	cfg.KVBlocks = 100 // one request of 64 + 1000 tokens (67 blocks) at a time
	h := startSim(t, cfg)
	rp := h.srv.Replica()
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		streamTimes(t, h, ctx, enginePrompt('a', 64, 1000, true), first)
	}()
	<-first
	// A second request waits for the blocks the stream holds.
	waiter, cancelWaiter := context.WithCancel(context.Background())
	queued := h.goDo(waiter, "/v1/completions", enginePrompt('b', 64, 1000, false))
	waitFor(t, "waiting request", func() bool { return rp.Stats().Waiting == 1 })
	cancelWaiter()
	recv(t, queued)
	waitFor(t, "queue place freed", func() bool { return rp.Stats().Waiting == 0 })
	if st := rp.Stats(); st.Running != 1 || st.KVBlocksUsed == 0 {
		t.Fatalf("running %d, blocks %d while the stream runs", st.Running, st.KVBlocksUsed)
	}
	cancel()
	<-done
	waitFor(t, "blocks freed", func() bool {
		st := rp.Stats()
		return st.Running == 0 && st.KVBlocksUsed == 0 && st.Cancelled == 2
	})
	// The freed blocks serve the next request.
	if r := h.do(context.Background(), http.MethodPost, "/v1/completions", enginePrompt('c', 64, 2, false)); r.status != http.StatusOK {
		t.Fatalf("after cancel: %d %s", r.status, r.body)
	}
}

func TestEngineStreamChunks(t *testing.T) {
	cfg := engineConfig(0, 0)
	cfg.StreamChunkTokens = 3
	h := startSim(t, cfg)
	r := h.do(context.Background(), http.MethodPost, "/v1/completions", enginePrompt('a', 8, 7, true))
	if n := strings.Count(r.body, "data: {"); n != 3 { // 3 + 3 + 1
		t.Fatalf("%d chunks, want 3:\n%s", n, r.body)
	}
	if !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
		t.Errorf("stream does not end with [DONE]:\n%s", r.body)
	}
}

func TestEngineCloseEndsEverything(t *testing.T) {
	settle := func(limit int) int {
		n := runtime.NumGoroutine()
		for deadline := time.Now().Add(10 * time.Second); n > limit && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			n = runtime.NumGoroutine()
		}
		return n
	}
	before := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == before {
			break
		}
		before = n
	}
	cfg := engineConfig(10*time.Millisecond, 0)
	cfg.KVBlocks = 13000 // two requests of 100,000 tokens (6,250 blocks) run, two wait
	srv, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	h := &simHarness{t: t, srv: srv, client: &http.Client{Transport: tr}}
	var pending []<-chan simResult
	for i := range 4 {
		pending = append(pending, h.goDo(context.Background(), "/v1/completions", enginePrompt(byte('a'+i), 64, 100000-64, i%2 == 0)))
	}
	waitFor(t, "requests in the engine", func() bool { st := srv.Replica().Stats(); return st.Running+st.Waiting == 4 })
	if err := srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, ch := range pending {
		if r := recv(t, ch); r.err == nil && r.status != http.StatusServiceUnavailable && r.status != http.StatusOK {
			t.Errorf("request pending at Close got %d", r.status)
		}
	}
	tr.CloseIdleConnections()
	if after := settle(before); after > before {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines: %d before, %d after Close\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

func TestEngineConfigValidation(t *testing.T) {
	ok := engineConfig(time.Millisecond, time.Microsecond)
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"negative step base", func(c *Config) { c.Latency.StepBase = -1 }, "Latency.StepBase"},
		{"negative step per token", func(c *Config) { c.Latency.StepPerToken = -1 }, "Latency.StepPerToken"},
		{"decode with engine", func(c *Config) { c.Latency.Decode = time.Millisecond }, "Latency.Decode"},
		{"kv blocks negative", func(c *Config) { c.KVBlocks = -1 }, "KVBlocks"},
		{"block tokens huge", func(c *Config) { c.BlockTokens = MaxBlockTokens + 1 }, "BlockTokens"},
		{"batch below concurrency", func(c *Config) { c.MaxBatchTokens = 4 }, "MaxBatchTokens"},
		{"prefix cache with engine", func(c *Config) { c.PrefixCache.Blocks = 8 }, "PrefixCache"},
		{"kv capacity with engine", func(c *Config) { c.KVCapacityTokens = 100 }, "KVCapacityTokens"},
		{"kv blocks without engine", func(c *Config) { c.Latency = Latency{}; c.KVBlocks = 8 }, "KVBlocks"},
		{"step base without engine", func(c *Config) { c.Latency = Latency{StepBase: time.Millisecond} }, "Latency.StepBase"},
		{"negative step per context token", func(c *Config) { c.Latency.StepPerContextToken = -1 }, "Latency.StepPerContextToken"},
		{"step per context token without engine", func(c *Config) { c.Latency = Latency{StepPerContextToken: time.Nanosecond} }, "Latency.StepPerContextToken"},
		{"async scheduling without engine", func(c *Config) { c.Latency = Latency{AsyncScheduling: true} }, "Latency.AsyncScheduling"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %v, want one naming %s", err, tc.field)
			}
		})
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := CalibratedEngine(0.1).Validate(); err != nil {
		t.Fatal(err)
	}
	d := Config{Latency: Latency{Kind: LatencyEngine}}.withDefaults()
	if d.Concurrency != DefaultEngineConcurrency || d.KVBlocks != DefaultEngineKVBlocks ||
		d.BlockTokens != DefaultEngineBlockTokens || d.MaxBatchTokens != DefaultEngineMaxBatchTokens {
		t.Errorf("engine defaults: %+v", d)
	}
}

func TestEngineMetrics(t *testing.T) {
	h := startSim(t, engineConfig(time.Millisecond, 0))
	rp := h.srv.Replica()
	h.do(context.Background(), http.MethodPost, "/v1/completions", enginePrompt('a', 40, 3, false))
	m := rp.MetricsText()
	for _, want := range []string{
		"sim_engine_steps_total{replica=\"sim\"} 3\n",
		"sim_engine_prefill_tokens_total{replica=\"sim\"} 40\n",
		"sim_engine_decode_tokens_total{replica=\"sim\"} 2\n",
		"sim_kv_blocks{replica=\"sim\"} 64\n",
		"sim_kv_blocks_cached{replica=\"sim\"} 2\n",
		"vllm:prefix_cache_queries_total{model_name=\"sim-model\"} 40\n",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
