package sim

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// streamHeaders sends a streamed completion and returns its response as
// soon as the status line and headers arrive, or nil if they do not come
// within wait. The body is the caller's to read and close; ctx ends the
// request.
func streamHeaders(t *testing.T, h *simHarness, ctx context.Context, body string, wait time.Duration) *http.Response {
	t.Helper()
	headers := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL()+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := h.client.Do(req)
		if err == nil {
			headers <- resp
		}
	}()
	select {
	case resp := <-headers:
		return resp
	case <-time.After(wait):
		return nil
	}
}

// vLLM's, SGLang's and TGI's HTTP servers start a streamed answer (status
// and headers) as soon as the request is set up, before it queues or
// prefills: a proxy timing first bytes sees no load in them. By default
// (and with StreamHeaders "immediate") the simulator does the same; with
// first_token the headers come with the first token.
func TestStreamHeadersImmediateComeBeforeTheQueue(t *testing.T) {
	slot := Config{Concurrency: 1, Latency: Latency{Kind: LatencyFixed, Duration: time.Hour}}
	engine := engineConfig(time.Hour, 0)
	engine.Concurrency = 1
	for _, tc := range []struct {
		name string
		cfg  Config
	}{{"slot queue", slot}, {"engine", engine}} {
		for _, mode := range []string{"", StreamHeadersImmediate, StreamHeadersFirstToken} {
			name := mode
			if name == "" {
				name = "default"
			}
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				cfg := tc.cfg
				cfg.StreamHeaders = mode
				h := startSim(t, cfg)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				// The one seat, held for an hour.
				go h.do(ctx, http.MethodPost, "/v1/completions", enginePrompt('a', 8, 4, false))
				waitFor(t, "the seat taken", func() bool { return h.srv.Replica().Stats().Running == 1 })
				early := mode != StreamHeadersFirstToken
				wait := 200 * time.Millisecond // first_token: nothing can come within the hour
				if early {
					wait = 10 * time.Second // only keeps a broken build from hanging
				}
				resp := streamHeaders(t, h, ctx, enginePrompt('b', 8, 4, true), wait)
				if resp == nil {
					if early {
						t.Fatal("no headers while the request waits for the seat: they wait for the first token")
					}
					return
				}
				defer resp.Body.Close()
				if !early {
					t.Fatal("headers came before the first token")
				}
				if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get(HeaderReplica) == "" {
					t.Fatalf("immediate headers: %d %v", resp.StatusCode, resp.Header)
				}
				// (The headers may come before the request joins the queue.)
				waitFor(t, "the stream queued", func() bool { return h.srv.Replica().Stats().Waiting == 1 })
				// Known only once admitted: announced as trailers, not sent.
				if resp.Header.Get(HeaderSeq) != "" || resp.Header.Get(HeaderCachedTokens) != "" {
					t.Errorf("seq or cached tokens among the early headers: %v", resp.Header)
				}
				if _, ok := resp.Trailer[HeaderSeq]; !ok {
					t.Errorf("%s not announced as a trailer: Trailer %v", HeaderSeq, resp.Trailer)
				}
			})
		}
	}
}

// The default headers come while the request, admitted, still prefills:
// the first token (the first byte of the body) comes later.
func TestStreamHeadersDefaultComeBeforeThePrefill(t *testing.T) {
	slot := Config{PrefixCache: PrefixCache{Blocks: 8}, Latency: Latency{Kind: LatencyPerToken, Prefill: time.Minute}}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{{"per_token", slot}, {"engine", engineConfig(time.Hour, 0)}} {
		t.Run(tc.name, func(t *testing.T) {
			h := startSim(t, tc.cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := streamHeaders(t, h, ctx, enginePrompt('a', 8, 4, true), 10*time.Second)
			if resp == nil {
				t.Fatal("no headers while the request prefills: they wait for the first token")
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("headers: %d %v", resp.StatusCode, resp.Header)
			}
			// The headers may come before the request is admitted; its
			// prefill then lasts 8 minutes (per_token) or an hour (engine).
			waitFor(t, "the stream admitted", func() bool { return h.srv.Replica().Stats().Running == 1 })
			if st := h.srv.Replica().Stats(); st.Served != 0 || st.CompletionTokens != 0 {
				t.Errorf("served already: %+v", st)
			}
			cancel()
			waitFor(t, "the request given up", func() bool { return h.srv.Replica().Stats().Running == 0 })
		})
	}
}

// On a stream whose headers went out early, X-Sim-Seq and
// X-Sim-Cached-Tokens come as trailers; with first_token, and on whole
// answers, they stay headers.
func TestStreamTrailersCarrySeqAndCachedTokens(t *testing.T) {
	slot := Config{PrefixCache: PrefixCache{Blocks: 64, BlockChars: 64}}
	engine := engineConfig(0, 0)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{{"slot queue", slot}, {"engine", engine}} {
		for _, mode := range []string{"", StreamHeadersFirstToken} {
			name := mode
			if name == "" {
				name = "default"
			}
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				cfg := tc.cfg
				cfg.StreamHeaders = mode
				h := startSim(t, cfg)
				// The same 100-token prompt twice (the second finds the
				// first's blocks), streamed, then whole.
				var got []simResult
				for _, stream := range []bool{true, true, false} {
					r := h.do(context.Background(), http.MethodPost, "/v1/completions", enginePrompt('a', 100, 3, stream))
					if r.err != nil || r.status != http.StatusOK || (stream && !strings.HasSuffix(r.body, "data: [DONE]\n\n")) {
						t.Fatalf("status %d err %v body %q", r.status, r.err, r.body)
					}
					got = append(got, r)
				}
				for i, r := range got {
					meta, other := r.header, r.trailer
					if i < 2 && mode == "" {
						meta, other = r.trailer, r.header
					}
					if want := []string{"1", "2", "3"}[i]; meta.Get(HeaderSeq) != want {
						t.Errorf("request %d: %s %q, want %s (header %v, trailer %v)", i+1, HeaderSeq, meta.Get(HeaderSeq), want, r.header, r.trailer)
					}
					if i == 0 && meta.Get(HeaderCachedTokens) != "0" || i > 0 && (meta.Get(HeaderCachedTokens) == "" || meta.Get(HeaderCachedTokens) == "0") {
						t.Errorf("request %d: %s %q (header %v, trailer %v)", i+1, HeaderCachedTokens, meta.Get(HeaderCachedTokens), r.header, r.trailer)
					}
					if other.Get(HeaderSeq) != "" || other.Get(HeaderCachedTokens) != "" {
						t.Errorf("request %d: seq or cached tokens in both the headers and the trailers: %v, %v", i+1, r.header, r.trailer)
					}
				}
			})
		}
	}
}

// A handler driven without a network (as a Caddy handler or a test with a
// ResponseRecorder) gives the trailers in the recorder's Result.
func TestStreamTrailersWithAResponseRecorder(t *testing.T) {
	rp, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	rec := httptest.NewRecorder()
	rp.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":2,"stream":true}`)))
	res := rec.Result()
	if res.StatusCode != http.StatusOK || res.Header.Get(HeaderSeq) != "" || res.Trailer.Get(HeaderSeq) != "1" {
		t.Fatalf("status %d, header %v, trailer %v: want %s 1 as a trailer", res.StatusCode, res.Header, res.Trailer, HeaderSeq)
	}
	if _, ok := res.Trailer[HeaderCachedTokens]; ok {
		t.Errorf("%s without a prefix cache: trailer %v", HeaderCachedTokens, res.Trailer)
	}
}

// A stream whose 200 went out while it waited is cut when the replica
// closes (the client sees a broken body), not ended as if complete; with
// nothing sent yet, it gets a 503 as before.
func TestStreamStartedEarlyIsCutOnClose(t *testing.T) {
	for _, mode := range []string{"", StreamHeadersFirstToken} {
		t.Run("stream_headers="+mode, func(t *testing.T) {
			rp, err := New(Config{StreamHeaders: mode, Concurrency: 1, Latency: Latency{Kind: LatencyFixed, Duration: time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(rp)
			defer ts.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions", strings.NewReader(`{"prompt":"a"}`))
				if resp, err := ts.Client().Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			waitFor(t, "the seat taken", func() bool { return rp.Stats().Running == 1 })
			type result struct {
				resp *http.Response
				err  error
			}
			done := make(chan result, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions",
					strings.NewReader(`{"prompt":"b","stream":true}`))
				resp, err := ts.Client().Do(req)
				done <- result{resp, err}
			}()
			waitFor(t, "the stream queued", func() bool { return rp.Stats().Waiting == 1 })
			if err := rp.Close(); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("stream: %v", r.err)
			}
			defer r.resp.Body.Close()
			body, err := io.ReadAll(bufio.NewReader(r.resp.Body))
			if mode == StreamHeadersFirstToken {
				if r.resp.StatusCode != http.StatusServiceUnavailable || err != nil {
					t.Fatalf("first_token: %d %v %q, want a 503", r.resp.StatusCode, err, body)
				}
				return
			}
			if r.resp.StatusCode != http.StatusOK || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("default: %d, body %q, read error %v; want 200 then a cut (unexpected EOF)", r.resp.StatusCode, body, err)
			}
		})
	}
}
