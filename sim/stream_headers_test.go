package sim

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// vLLM's, SGLang's and TGI's HTTP servers start a streamed answer (status
// and headers) as soon as the request is set up, before it queues or
// prefills: a proxy timing first bytes sees no load in them. With
// StreamHeaders "immediate" the simulator does the same; by default
// (first_token) the headers come with the first token, as before.
func TestStreamHeadersImmediateComeBeforeTheQueue(t *testing.T) {
	slot := Config{Concurrency: 1, Latency: Latency{Kind: LatencyFixed, Duration: time.Hour}}
	engine := engineConfig(time.Hour, 0)
	engine.Concurrency = 1
	for _, tc := range []struct {
		name string
		cfg  Config
	}{{"slot queue", slot}, {"engine", engine}} {
		for _, mode := range []string{StreamHeadersImmediate, StreamHeadersFirstToken} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				cfg := tc.cfg
				cfg.StreamHeaders = mode
				h := startSim(t, cfg)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				// The one seat, held for an hour.
				go h.do(ctx, http.MethodPost, "/v1/completions", enginePrompt('a', 8, 4, false))
				for h.srv.Replica().Stats().Running == 0 {
					time.Sleep(time.Millisecond)
				}
				headers := make(chan *http.Response, 1)
				go func() {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL()+"/v1/completions",
						strings.NewReader(enginePrompt('b', 8, 4, true)))
					req.Header.Set("Content-Type", "application/json")
					resp, err := h.client.Do(req)
					if err == nil {
						headers <- resp
					}
				}()
				wait := 200 * time.Millisecond // first_token: nothing can come within the hour
				if mode == StreamHeadersImmediate {
					wait = 10 * time.Second // only keeps a broken build from hanging
				}
				select {
				case resp := <-headers:
					defer resp.Body.Close()
					if mode != StreamHeadersImmediate {
						t.Fatal("headers came before the first token")
					}
					if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get(HeaderReplica) == "" {
						t.Fatalf("immediate headers: %d %v", resp.StatusCode, resp.Header)
					}
				case <-time.After(wait):
					if mode == StreamHeadersImmediate {
						t.Fatal("no headers while the request waits for the seat: they wait for the first token")
					}
				}
			})
		}
	}
}
