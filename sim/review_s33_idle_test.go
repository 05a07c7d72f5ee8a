package sim

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// vanishMidStream sends a streaming request on a raw connection, reads up
// to the first event and drops the connection, as a client that goes away
// mid-stream.
func vanishMidStream(addr, body string) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		if strings.HasPrefix(line, "data: ") || (strings.HasPrefix(line, "HTTP/") && !strings.Contains(line, " 200 ")) {
			return nil
		}
	}
}

// TestReviewS33StormReturnsToIdle sends a storm of requests that end every
// way a request can end (served, streamed, injected error, stalled, too
// large, cancelled while waiting or while served, client gone mid-stream)
// to each latency model with its accounting (engine KV blocks, KV tokens,
// prefill line, prefix cache), and checks that once they are all over
// the replica is idle: nothing running, waiting, prefilling or held, and
// every request counted once.
func TestReviewS33StormReturnsToIdle(t *testing.T) {
	faults := Faults{ErrorRate: 0.15, StallRate: 0.1, Stall: 2 * time.Millisecond}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"engine", Config{Concurrency: 4, KVBlocks: 40, BlockTokens: 16, MaxBatchTokens: 64,
			Latency: Latency{Kind: LatencyEngine, StepBase: 200 * time.Microsecond, StepPerToken: time.Microsecond}, Faults: faults}},
		{"engine_async_gpu", Config{Concurrency: 4, KVBlocks: 40, BlockTokens: 16, MaxBatchTokens: 64, GPU: NewGPU(0.5),
			Latency: Latency{Kind: LatencyEngine, StepBase: 200 * time.Microsecond, StepPerToken: time.Microsecond, AsyncScheduling: true}, Faults: faults}},
		{"per_token_kv_prefill_line", Config{Concurrency: 3, KVCapacityTokens: 300, PrefillBlocksDecode: true,
			PrefixCache: PrefixCache{Blocks: 8, BlockChars: 32},
			Latency:     Latency{Kind: LatencyPerToken, Prefill: 5 * time.Microsecond, Decode: 20 * time.Microsecond, BatchSlowdown: 0.1}, Faults: faults}},
		{"fixed_first_token", Config{Concurrency: 2, StreamHeaders: StreamHeadersFirstToken,
			Latency: Latency{Kind: LatencyFixed, Duration: time.Millisecond, PrefillPerToken: time.Microsecond}, Faults: faults}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startSim(t, tc.cfg)
			rp := h.srv.Replica()
			rng := rand.New(rand.NewPCG(33, 1))
			var wg sync.WaitGroup
			const n = 120
			for i := range n {
				lead := byte('a' + rng.IntN(3))
				tokens := 8 + rng.IntN(120)
				out := 1 + rng.IntN(40)
				if rng.IntN(10) == 0 {
					out = 2000 // more KV blocks than the engine has: 400
				}
				stream := rng.IntN(2) == 0
				how := rng.IntN(4) // 0, 1: to the end; 2: cancelled; 3: vanishes mid-stream
				body := enginePrompt(lead, tokens, out, stream)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if how == 3 && stream {
						_ = vanishMidStream(h.srv.Addr(), body)
						return
					}
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					if how == 2 {
						time.AfterFunc(time.Duration(1+i%5)*time.Millisecond, cancel)
					}
					h.do(ctx, http.MethodPost, "/v1/completions", body)
				}()
			}
			wg.Wait()
			waitFor(t, "the replica to be idle", func() bool {
				st := rp.Stats()
				return st.Running == 0 && st.Waiting == 0 && st.KVBlocksUsed == 0 && st.KVTokens == 0 &&
					st.Prefilling == 0 && st.PrefillWaiting == 0 &&
					st.Served+st.Errors+st.Cancelled+st.Rejected == st.Requests
			})
			if rp.eng != nil {
				rp.eng.mu.Lock()
				checkKV(t, rp.eng, "idle")
				rp.eng.mu.Unlock()
				waitFor(t, "the step loop to stop", func() bool {
					rp.eng.mu.Lock()
					defer rp.eng.mu.Unlock()
					return !rp.eng.loopOn
				})
			}
			m := rp.MetricsText()
			for _, want := range []string{
				`vllm:num_requests_running{model_name="sim-model"} 0` + "\n",
				`vllm:num_requests_waiting{model_name="sim-model"} 0` + "\n",
			} {
				if !strings.Contains(m, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
			if (tc.cfg.KVBlocks > 0 || tc.cfg.KVCapacityTokens > 0) && !strings.Contains(m, `vllm:kv_cache_usage_perc{model_name="sim-model"} 0`+"\n") {
				t.Errorf("KV usage not back to 0:\n%s", m)
			}
		})
	}
}
