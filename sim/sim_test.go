package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// waitFor polls cond until it holds; the timeout only guards against hangs.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

type simHarness struct {
	t      *testing.T
	srv    *Server
	client *http.Client
}

func startSim(t *testing.T, cfg Config) *simHarness {
	t.Helper()
	srv, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	h := &simHarness{t: t, srv: srv, client: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
	t.Cleanup(func() {
		_ = srv.Close()
		tr.CloseIdleConnections()
	})
	return h
}

type simResult struct {
	status  int
	header  http.Header
	trailer http.Header // after the body was read to EOF
	body    string
	err     error
}

func (h *simHarness) do(ctx context.Context, method, path, body string) simResult {
	req, err := http.NewRequestWithContext(ctx, method, h.srv.URL()+path, strings.NewReader(body))
	if err != nil {
		return simResult{err: err}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return simResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return simResult{status: resp.StatusCode, header: resp.Header, trailer: resp.Trailer, body: string(b), err: err}
}

// goDo sends a request in the background.
func (h *simHarness) goDo(ctx context.Context, path, body string) <-chan simResult {
	ch := make(chan simResult, 1)
	go func() { ch <- h.do(ctx, http.MethodPost, path, body) }()
	return ch
}

func recv(t *testing.T, ch <-chan simResult) simResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for a response")
		return simResult{}
	}
}

func seqOf(t *testing.T, r simResult) int {
	t.Helper()
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("request failed: status %d err %v body %s", r.status, r.err, r.body)
	}
	n, err := strconv.Atoi(r.header.Get(HeaderSeq))
	if err != nil {
		t.Fatalf("bad %s header %q", HeaderSeq, r.header.Get(HeaderSeq))
	}
	return n
}

const simPrompt = `{"prompt":"hello world","max_tokens":2}`

func TestSimFIFOAndCounts(t *testing.T) {
	for _, conc := range []int{1, 2} {
		t.Run(fmt.Sprintf("concurrency=%d", conc), func(t *testing.T) {
			// Every request stalls (holding its slot) until the stall is
			// cleared, which makes the running/waiting counts exact.
			h := startSim(t, Config{
				Name:        "r1",
				Concurrency: conc,
				Latency:     Latency{Kind: LatencyFixed, Duration: time.Millisecond},
				Faults:      Faults{StallRate: 1, Stall: time.Hour},
			})
			rp := h.srv.Replica()
			const waiting = 4
			var results []<-chan simResult
			for i := range conc {
				results = append(results, h.goDo(context.Background(), "/v1/completions", simPrompt))
				waitFor(t, "running request", func() bool { return rp.Stats().Running == i+1 })
			}
			for i := range waiting {
				results = append(results, h.goDo(context.Background(), "/v1/completions", simPrompt))
				waitFor(t, "queued request", func() bool { return rp.Stats().Waiting == i+1 })
			}
			st := rp.Stats()
			if st.Running != conc || st.Waiting != waiting {
				t.Fatalf("running/waiting = %d/%d, want %d/%d", st.Running, st.Waiting, conc, waiting)
			}
			metrics := h.do(context.Background(), http.MethodGet, "/metrics", "")
			for _, want := range []string{
				fmt.Sprintf(`vllm:num_requests_running{model_name="sim-model"} %d`, conc),
				fmt.Sprintf(`vllm:num_requests_waiting{model_name="sim-model"} %d`, waiting),
			} {
				if !strings.Contains(metrics.body, want+"\n") {
					t.Errorf("/metrics lacks %q:\n%s", want, metrics.body)
				}
			}

			// Recover: the stalls end and everything is served in arrival order.
			if err := rp.SetFaults(Faults{}); err != nil {
				t.Fatal(err)
			}
			for i, ch := range results {
				r := recv(t, ch)
				if got := seqOf(t, r); got != i+1 {
					t.Errorf("request %d got slot #%d, want #%d (FIFO)", i, got, i+1)
				}
				if r.header.Get(HeaderReplica) != "r1" {
					t.Errorf("%s = %q, want r1", HeaderReplica, r.header.Get(HeaderReplica))
				}
			}
			st = rp.Stats()
			want := Stats{
				Requests: uint64(conc + waiting), Served: uint64(conc + waiting), Stalls: uint64(conc),
				Started: uint64(conc + waiting), MaxRunning: conc, MaxWaiting: waiting,
				MaxInFlight: conc + waiting, Queued: waiting,
				PromptTokens: uint64(2 * (conc + waiting)), CompletionTokens: uint64(2 * (conc + waiting)),
			}
			// The waiters waited at least until the stalls were cleared.
			if st.QueueWait <= 0 || st.MaxQueueWait <= 0 || st.MaxQueueWait > st.QueueWait {
				t.Errorf("QueueWait = %v, MaxQueueWait = %v, want 0 < max ≤ sum (%d requests queued)", st.QueueWait, st.MaxQueueWait, waiting)
			}
			st.QueueWait, st.MaxQueueWait = 0, 0
			if st != want {
				t.Errorf("Stats = %+v\nwant    %+v", st, want)
			}
		})
	}
}

func TestSimCancelledWaiterIsNeverServed(t *testing.T) {
	h := startSim(t, Config{Faults: Faults{StallRate: 1, Stall: time.Hour}})
	rp := h.srv.Replica()

	head := h.goDo(context.Background(), "/v1/completions", simPrompt)
	waitFor(t, "head running", func() bool { return rp.Stats().Running == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quitter := h.goDo(ctx, "/v1/completions", simPrompt)
	waitFor(t, "first waiter", func() bool { return rp.Stats().Waiting == 1 })
	last := h.goDo(context.Background(), "/v1/completions", simPrompt)
	waitFor(t, "second waiter", func() bool { return rp.Stats().Waiting == 2 })

	cancel()
	if r := recv(t, quitter); r.err == nil {
		t.Fatalf("cancelled request answered: %d %s", r.status, r.body)
	}
	waitFor(t, "cancelled waiter removed", func() bool {
		st := rp.Stats()
		return st.Waiting == 1 && st.Cancelled == 1
	})
	if st := rp.Stats(); st.Running != 1 || st.Started != 1 {
		t.Fatalf("after cancel: %+v", st)
	}

	if err := rp.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if got := seqOf(t, recv(t, head)); got != 1 {
		t.Errorf("head got slot #%d, want #1", got)
	}
	if got := seqOf(t, recv(t, last)); got != 2 {
		t.Errorf("last waiter got slot #%d, want #2 (the cancelled one must not take a slot)", got)
	}
	st := rp.Stats()
	if st.Served != 2 || st.Started != 2 || st.Cancelled != 1 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("final stats: %+v", st)
	}
	if m := rp.MetricsText(); !strings.Contains(m, `status="499"} 1`) {
		t.Errorf("metrics lack the cancelled request:\n%s", m)
	}
}

func TestSimCancelledWhileServing(t *testing.T) {
	h := startSim(t, Config{Latency: Latency{Kind: LatencyFixed, Duration: time.Hour}})
	rp := h.srv.Replica()
	ctx, cancel := context.WithCancel(context.Background())
	ch := h.goDo(ctx, "/v1/completions", simPrompt)
	waitFor(t, "running", func() bool { return rp.Stats().Running == 1 })
	next := h.goDo(context.Background(), "/v1/completions", simPrompt)
	waitFor(t, "waiting", func() bool { return rp.Stats().Waiting == 1 })
	cancel()
	recv(t, ch)
	// The slot passes to the waiter, which now holds it for an hour.
	waitFor(t, "slot handed over", func() bool {
		st := rp.Stats()
		return st.Running == 1 && st.Waiting == 0 && st.Started == 2 && st.Cancelled == 1
	})
	_ = h.srv.Close()
	if r := recv(t, next); r.err == nil && r.status != http.StatusServiceUnavailable {
		t.Errorf("request in service at Close: status %d, want 503 or a cut connection", r.status)
	}
}

func readSSE(t *testing.T, body string) (events []string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		events = append(events, data)
	}
	if !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream does not end with data: [DONE]: %q", body)
	}
	return events
}

func TestSimStreaming(t *testing.T) {
	h := startSim(t, Config{
		Name:    "streamer",
		Latency: Latency{Kind: LatencyPerToken, Prefill: 10 * time.Microsecond, Decode: 100 * time.Microsecond, BatchSlowdown: 0.1},
	})
	cases := []struct {
		path, body string
		check      func(t *testing.T, i int, ev map[string]any)
	}{
		{"/v1/completions", `{"prompt":["abcd","efgh"],"max_tokens":5,"stream":true}`, func(t *testing.T, i int, ev map[string]any) {
			if ev["object"] != "text_completion" {
				t.Errorf("object %v", ev["object"])
			}
		}},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi there"}],"max_tokens":5,"stream":true}`, func(t *testing.T, i int, ev map[string]any) {
			delta := ev["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
			if (i == 0) != (delta["role"] == "assistant") {
				t.Errorf("chunk %d delta %v", i, delta)
			}
		}},
		{"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":5},"stream":true}`, func(t *testing.T, i int, ev map[string]any) {
			meta := ev["meta_info"].(map[string]any)
			if meta["completion_tokens"] != float64(i+1) {
				t.Errorf("chunk %d meta_info %v", i, meta)
			}
		}},
	}
	for _, c := range cases {
		t.Run(strings.TrimPrefix(c.path, "/"), func(t *testing.T) {
			r := h.do(context.Background(), http.MethodPost, c.path, c.body)
			if r.err != nil || r.status != http.StatusOK {
				t.Fatalf("status %d err %v body %s", r.status, r.err, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type %q", ct)
			}
			if r.header.Get(HeaderReplica) != "streamer" {
				t.Errorf("missing %s header", HeaderReplica)
			}
			// The headers went out before the slot: the seq is a trailer.
			if r.header.Get(HeaderSeq) != "" || r.trailer.Get(HeaderSeq) == "" {
				t.Errorf("%s: header %q, trailer %q; want it as a trailer only", HeaderSeq, r.header.Get(HeaderSeq), r.trailer.Get(HeaderSeq))
			}
			events := readSSE(t, r.body)
			chunks := events[:len(events)-1]
			if len(chunks) != 5 {
				t.Fatalf("got %d chunks, want 5 (one per token): %q", len(chunks), r.body)
			}
			for i, raw := range chunks {
				var ev map[string]any
				if err := json.Unmarshal([]byte(raw), &ev); err != nil {
					t.Fatalf("chunk %d: %v: %s", i, err, raw)
				}
				c.check(t, i, ev)
			}
		})
	}
	if st := h.srv.Replica().Stats(); st.Served != 3 || st.CompletionTokens != 15 {
		t.Errorf("stats %+v", st)
	}
}

func TestSimStreamChunksAndUsage(t *testing.T) {
	// Served through ServeHTTP directly, without a network.
	rp, err := New(Config{StreamChunkTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/completions",
		strings.NewReader(`{"prompt":"x","max_tokens":10,"stream":true,"stream_options":{"include_usage":true}}`))
	rec := httptest.NewRecorder()
	rp.ServeHTTP(rec, req)
	events := readSSE(t, rec.Body.String())
	// 10 tokens in chunks of 4 → 3 chunks, then the usage chunk, then [DONE].
	if len(events) != 5 {
		t.Fatalf("got %d events: %q", len(events), rec.Body.String())
	}
	var usage struct {
		Usage map[string]int `json:"usage"`
	}
	if err := json.Unmarshal([]byte(events[3]), &usage); err != nil || usage.Usage["completion_tokens"] != 10 {
		t.Errorf("usage chunk %s (%v)", events[3], err)
	}
}

func TestSimNonStreamingShapes(t *testing.T) {
	h := startSim(t, Config{Latency: Latency{Kind: LatencyLognormal, Duration: time.Millisecond, Sigma: 0.5}, Seed: 7})
	t.Run("completions", func(t *testing.T) {
		r := h.do(context.Background(), http.MethodPost, "/v1/completions", `{"model":"m1","prompt":"abcdefgh","max_tokens":3}`)
		var resp struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			Model   string `json:"model"`
			Choices []struct {
				Text         string `json:"text"`
				Index        int    `json:"index"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct{ PromptTokens, CompletionTokens, TotalTokens int } `json:"usage"`
		}
		decodeOK(t, r, &resp)
		if resp.Object != "text_completion" || resp.Model != "m1" || resp.ID == "" || resp.Created == 0 ||
			len(resp.Choices) != 1 || resp.Choices[0].Text == "" || resp.Choices[0].FinishReason != "length" {
			t.Errorf("unexpected response %s", r.body)
		}
		if !strings.Contains(r.body, `"prompt_tokens":2,"completion_tokens":3,"total_tokens":5`) {
			t.Errorf("usage: %s", r.body)
		}
	})
	t.Run("chat", func(t *testing.T) {
		r := h.do(context.Background(), http.MethodPost, "/v1/chat/completions",
			`{"messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efghijkl"}]}],"max_completion_tokens":2}`)
		var resp struct {
			Object  string `json:"object"`
			Model   string `json:"model"`
			Choices []struct {
				Message struct{ Role, Content string } `json:"message"`
			} `json:"choices"`
		}
		decodeOK(t, r, &resp)
		if resp.Object != "chat.completion" || resp.Model != DefaultModel || len(resp.Choices) != 1 ||
			resp.Choices[0].Message.Role != "assistant" || resp.Choices[0].Message.Content == "" {
			t.Errorf("unexpected response %s", r.body)
		}
		if !strings.Contains(r.body, `"prompt_tokens":3,"completion_tokens":2,"total_tokens":5`) {
			t.Errorf("usage: %s", r.body)
		}
	})
	t.Run("generate", func(t *testing.T) {
		r := h.do(context.Background(), http.MethodPost, "/generate", `{"text":"abcd","sampling_params":{"max_new_tokens":4}}`)
		var resp struct {
			Text     string `json:"text"`
			MetaInfo struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"meta_info"`
		}
		decodeOK(t, r, &resp)
		if resp.Text == "" || resp.MetaInfo.PromptTokens != 1 || resp.MetaInfo.CompletionTokens != 4 {
			t.Errorf("unexpected response %s", r.body)
		}
	})
	t.Run("default max tokens", func(t *testing.T) {
		r := h.do(context.Background(), http.MethodPost, "/v1/completions", `{"prompt":[1,2,3]}`)
		if !strings.Contains(r.body, `"prompt_tokens":3,"completion_tokens":16,`) {
			t.Errorf("usage: %s", r.body)
		}
	})
}

func decodeOK(t *testing.T, r simResult, v any) {
	t.Helper()
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("status %d err %v body %s", r.status, r.err, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if err := json.Unmarshal([]byte(r.body), v); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
}

func errorType(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("not a JSON error: %s (%v)", body, err)
	}
	return e.Error.Type
}

func TestSimRoutesAndBadRequests(t *testing.T) {
	h := startSim(t, Config{Name: "r9", MaxBodyBytes: 256})
	ctx := context.Background()
	cases := []struct {
		method, path, body string
		status             int
		errType            string
	}{
		{http.MethodGet, "/nope", "", 404, "not_found"},
		{http.MethodGet, "/v1/completions", "", 405, "method_not_allowed"},
		{http.MethodPost, "/health", "{}", 405, "method_not_allowed"},
		{http.MethodPost, "/v1/completions", "{not json", 400, "invalid_request"},
		{http.MethodPost, "/v1/completions", `{"max_tokens":3}`, 400, "invalid_request"},
		{http.MethodPost, "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "invalid_request"},
		{http.MethodPost, "/v1/completions", `{"prompt":{"a":1}}`, 400, "invalid_request"},
		{http.MethodPost, "/v1/completions", `{"prompt":"` + strings.Repeat("x", 300) + `"}`, 413, "invalid_request"},
	}
	for _, c := range cases {
		r := h.do(ctx, c.method, c.path, c.body)
		if r.err != nil || r.status != c.status {
			t.Errorf("%s %s %.40s: status %d (err %v), want %d", c.method, c.path, c.body, r.status, r.err, c.status)
			continue
		}
		if got := errorType(t, r.body); got != c.errType {
			t.Errorf("%s %s: error type %q, want %q", c.method, c.path, got, c.errType)
		}
		if r.header.Get(HeaderReplica) != "r9" {
			t.Errorf("%s %s: missing %s", c.method, c.path, HeaderReplica)
		}
		if c.status == 405 && r.header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", c.method, c.path)
		}
	}
	if r := h.do(ctx, http.MethodGet, "/health", ""); r.status != 200 || strings.TrimSpace(r.body) != `{"status":"ok"}` {
		t.Errorf("/health: %d %s", r.status, r.body)
	}
	if r := h.do(ctx, http.MethodGet, "/v1/models", ""); r.status != 200 || !strings.Contains(r.body, `"id":"sim-model"`) {
		t.Errorf("/v1/models: %d %s", r.status, r.body)
	}
	if st := h.srv.Replica().Stats(); st.Rejected != 6 || st.Served != 0 || st.Started != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestSimErrorRateAndRecovery(t *testing.T) {
	h := startSim(t, Config{Faults: Faults{ErrorRate: 1, ErrorStatus: 503}})
	rp := h.srv.Replica()
	for range 3 {
		r := h.do(context.Background(), http.MethodPost, "/v1/completions", simPrompt)
		if r.status != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want 503: %s", r.status, r.body)
		}
		if got := errorType(t, r.body); got != "simulated_fault" {
			t.Errorf("error type %q", got)
		}
	}
	if err := rp.SetFaults(Faults{ErrorRate: 2}); err == nil || !strings.Contains(err.Error(), "ErrorRate") {
		t.Errorf("SetFaults with a bad rate: %v", err)
	}
	if rp.Faults().ErrorRate != 1 {
		t.Errorf("a rejected SetFaults changed the faults")
	}
	if err := rp.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if r := h.do(context.Background(), http.MethodPost, "/v1/completions", simPrompt); r.status != 200 {
		t.Errorf("after recovery: %d %s", r.status, r.body)
	}
	st := rp.Stats()
	if st.Errors != 3 || st.Served != 1 || st.Started != 1 {
		t.Errorf("stats %+v", st)
	}
	m := rp.MetricsText()
	for _, want := range []string{`status="503"} 3`, `status="200"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
}

func TestSimBadConfigNamesField(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{Concurrency: -1}, "Concurrency"},
		{Config{Name: "a\nb"}, "Name"},
		{Config{Model: `x"y`}, "Model"},
		{Config{MaxTokens: -5}, "MaxTokens"},
		{Config{StreamChunkTokens: -1}, "StreamChunkTokens"},
		{Config{MaxBodyBytes: -1}, "MaxBodyBytes"},
		{Config{Latency: Latency{Kind: "gaussian"}}, "Latency.Kind"},
		{Config{Latency: Latency{Duration: -time.Second}}, "Latency.Duration"},
		{Config{Latency: Latency{Kind: LatencyLognormal}}, "Latency.Duration"},
		{Config{Latency: Latency{Kind: LatencyLognormal, Duration: time.Second, Sigma: -1}}, "Latency.Sigma"},
		{Config{Latency: Latency{Kind: LatencyLognormal, Duration: time.Second, Sigma: math.NaN()}}, "Latency.Sigma"},
		{Config{Latency: Latency{Kind: LatencyPerToken, Prefill: -1}}, "Latency.Prefill"},
		{Config{Latency: Latency{Kind: LatencyPerToken, Decode: -1}}, "Latency.Decode"},
		{Config{Latency: Latency{Kind: LatencyPerToken, BatchSlowdown: -0.5}}, "Latency.BatchSlowdown"},
		{Config{Faults: Faults{ErrorRate: 1.5}}, "Faults.ErrorRate"},
		{Config{Faults: Faults{ErrorRate: math.NaN()}}, "Faults.ErrorRate"},
		{Config{Faults: Faults{ErrorStatus: 200}}, "Faults.ErrorStatus"},
		{Config{Faults: Faults{StallRate: -0.1, Stall: time.Second}}, "Faults.StallRate"},
		{Config{Faults: Faults{StallRate: 0.5}}, "Faults.Stall "},
		{Config{Faults: Faults{Stall: -time.Second}}, "Faults.Stall "},
	}
	for _, c := range cases {
		_, err := New(c.cfg)
		if err == nil {
			t.Errorf("New(%+v) succeeded, want an error naming %s", c.cfg, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) error %q does not name %s", c.cfg, err, c.want)
		}
	}
	if _, err := Start(Config{Concurrency: -3}); err == nil {
		t.Error("Start accepted a bad config")
	}
	rp, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c := rp.Config(); c.Name != DefaultName || c.Concurrency != 1 || c.MaxTokens != DefaultMaxTokens ||
		c.Latency.Kind != LatencyFixed || c.Faults.ErrorStatus != DefaultErrorStatus {
		t.Errorf("defaults not applied: %+v", c)
	}
}

func TestSimMetricsNames(t *testing.T) {
	h := startSim(t, Config{Model: "llama"})
	h.do(context.Background(), http.MethodPost, "/v1/completions", simPrompt)
	r := h.do(context.Background(), http.MethodGet, "/metrics", "")
	if r.status != 200 {
		t.Fatalf("/metrics status %d", r.status)
	}
	for _, want := range []string{
		"# TYPE vllm:num_requests_running gauge\n",
		"# TYPE vllm:num_requests_waiting gauge\n",
		"# TYPE vllm:request_success_total counter\n",
		`vllm:request_success_total{model_name="llama"} 1` + "\n",
		`vllm:num_requests_running{model_name="llama"} 0` + "\n",
		`vllm:num_requests_waiting{model_name="llama"} 0` + "\n",
		`sim_requests_total{replica="sim",status="200"} 1` + "\n",
		"# TYPE sim_requests_total counter\n",
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, r.body)
		}
	}
}

func TestSimLognormalSeeded(t *testing.T) {
	cfg := Config{Latency: Latency{Kind: LatencyLognormal, Duration: 200 * time.Millisecond, Sigma: 0.5}, Seed: 42}
	a, _ := New(cfg)
	b, _ := New(cfg)
	const n = 20000
	var sum float64
	for i := range n {
		x, y := a.serviceTime(), b.serviceTime()
		if x != y {
			t.Fatalf("draw %d differs with the same seed: %v vs %v", i, x, y)
		}
		sum += float64(x)
	}
	// Deterministic for a fixed seed; checks that Duration is the mean.
	if mean := time.Duration(sum / n); mean < 190*time.Millisecond || mean > 210*time.Millisecond {
		t.Errorf("sample mean %v, want about 200ms", mean)
	}
}

func TestSimBatchSlowdown(t *testing.T) {
	rp, _ := New(Config{Concurrency: 4, Latency: Latency{Kind: LatencyPerToken, Decode: 10 * time.Millisecond, BatchSlowdown: 0.5}})
	if d := rp.decodeStep(); d != 10*time.Millisecond {
		t.Errorf("idle step %v", d)
	}
	for range 3 {
		if _, err := rp.q.acquire(context.Background(), rp.done); err != nil {
			t.Fatal(err)
		}
	}
	if d := rp.decodeStep(); d != 20*time.Millisecond { // 10ms × (1 + 0.5 × 2)
		t.Errorf("step with 3 running %v, want 20ms", d)
	}
}

func TestSimNoGoroutineLeakAfterClose(t *testing.T) {
	settle := func(limit int) int {
		n := runtime.NumGoroutine()
		for deadline := time.Now().Add(10 * time.Second); n > limit && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			n = runtime.NumGoroutine()
		}
		return n
	}
	// Let goroutines of earlier tests wind down before counting.
	before := runtime.NumGoroutine()
	for i := 0; i < 100; i++ {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == before {
			break
		}
		before = n
	}
	srv, err := Start(Config{Concurrency: 2, Faults: Faults{StallRate: 1, Stall: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	h := &simHarness{t: t, srv: srv, client: &http.Client{Transport: tr}}
	var pending []<-chan simResult
	for range 5 {
		pending = append(pending, h.goDo(context.Background(), "/v1/completions", simPrompt))
	}
	pending = append(pending, h.goDo(context.Background(), "/v1/chat/completions",
		`{"messages":[{"role":"user","content":"x"}],"stream":true}`))
	waitFor(t, "requests queued", func() bool { st := srv.Replica().Stats(); return st.Running+st.Waiting == 6 })
	if r := h.do(context.Background(), http.MethodGet, "/health", ""); r.status != 200 {
		t.Fatalf("/health %d", r.status)
	}

	if err := srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, ch := range pending {
		if r := recv(t, ch); r.err == nil && r.status != http.StatusServiceUnavailable {
			t.Errorf("request pending at Close got %d", r.status)
		}
	}
	tr.CloseIdleConnections()
	if after := settle(before); after > before {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines: %d before, %d after Close\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// A closed replica answers 503.
	rec := httptest.NewRecorder()
	srv.Replica().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("closed replica answered %d", rec.Code)
	}
}
