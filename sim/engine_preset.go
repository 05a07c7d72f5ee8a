package sim

import "time"

// CalibratedEngine returns a replica that behaves like the one real engine
// measured in shared/real-engine/2026-11-24-h100-transformers.md:
// transformers continuous batching on one H100 (random-weight 3B Llama,
// KV cache 96 blocks × 128 tokens with prefix caching, max_batch_tokens
// 2048, FIFO), 32 output tokens per request.
//
// The engine's shape is copied (KVBlocks 96, BlockTokens 128,
// MaxBatchTokens 2048, MaxTokens 32); the step costs are fitted to the
// measured table (prompts of 1,540 tokens sharing one of 4 prefixes of
// 1,500, streamed, Poisson arrivals for 25 s, 40 s timeout):
//
//	arrivals   TTFT p50 / p90   e2e p50 / p90   output tokens/s
//	4 req/s    0.49 / 1.65 s    4.79 / 6.11 s    94
//	8 req/s    4.80 / 9.60 s    8.41 / 13.7 s   147
//	12 req/s   19.7 / 33.6 s    23.3 / 36.6 s   156
//
// Two mechanisms of the measured engine are modelled besides the batch:
// AsyncScheduling (transformers plans the next batch while the GPU runs the
// current one, so an arrival joins the step after the next: about one step
// more to the first token, the light-load TTFT p50) and
// StepPerContextToken (its paged SDPA attention gathers the whole KV of
// every scheduled request each step, so a decode of a 1,540-token request
// costs more than one token). Fitted: StepBase 120 ms, StepPerToken
// 0.1 ms, StepPerContextToken 0.2 µs. The batch is bounded by the KV
// blocks, not by Concurrency (64): each request holds 13 blocks of which 11
// are its shared prefix's, so with the 4 prefixes pinned 26 requests run at
// once; a saturated step decodes 26 (~8 ms of context) and prefills ~105
// tokens (one admission per request that ends), ~142 ms, ~5.7 requests/s
// steady (~165 tokens/s as the table counts them, from first arrival to
// last answer); at 4 req/s ~18 requests run with steps of ~135 ms, ~4.2 s
// for 31 tokens. StepBase is most of a step: the measured engine took
// ~3.6–4.3 s for 31 tokens at every load.
//
// Simulated / real (SLUICE_CALIBRATE=1 SLUICE_CALIBRATE_SCALE=0.25, the
// measured run's 94/206/320 arrivals; shared 2-core box), ratio:
//
//	4 req/s   TTFT p50 0.37 (0.75)  p90 0.42 (0.25)  e2e p50 4.55 (0.95)  p90 4.63 (0.76)  104 tok/s (1.10)
//	8 req/s   TTFT p50 5.59 (1.16)  p90 10.3 (1.07)  e2e p50 10.0 (1.19)  p90 14.6 (1.07)  164 tok/s (1.12)
//	12 req/s  TTFT p50 17.2 (0.88)  p90 29.6 (0.88)  e2e p50 21.6 (0.93)  p90 34.0 (0.93)  168 tok/s (1.08)
//
// (prefix reuse 0.88/0.90/0.90 against 0.87/0.89/0.90). Within 25%
// everywhere but the TTFT tail at 4 req/s: there ~10% of the real requests
// waited 1.6–2.4 s for their first token, which no steady mechanism
// reproduces without breaking the other loads. It is not prefix misses (the
// measured reuse, 0.87, is 1,408/1,540 of the prompt tokens for all but
// the first request of each of the 4 prefixes), nor a full batch (at
// 8 and 12 req/s the same engine served ~5 requests/s, so at 4 req/s it ran
// below its KV bound); a cap that queued at 4 req/s (transformers' FIFO
// stops admitting under 20% free blocks, 17 requests here) or costlier
// cold prefills would slow 8 req/s well past the measured figures, which
// show no early stall. Stalls on a fresh engine (CUDA-graph capture or
// compilation for each new batch shape, the 4 req/s run coming first) fit
// it; this model has none. The sluice-bench harness (engine-calibration)
// draws its own arrivals (111/218/310 requests instead of 94/206/320), so
// its 8 req/s runs heavier and its 12 req/s lighter than the real ones.
// See engine_calibration_test.go for the check (SLUICE_CALIBRATE=1 runs the
// full table).
//
// timeScale multiplies every duration (1 = real time; 0.1 runs a second
// of GPU time in 100 ms); it must be positive.
func CalibratedEngine(timeScale float64) Config {
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * timeScale) }
	return Config{
		Name:           "calibrated-engine",
		Concurrency:    64,
		KVBlocks:       96,
		BlockTokens:    128,
		MaxBatchTokens: 2048,
		MaxTokens:      32,
		Latency: Latency{
			Kind:                LatencyEngine,
			StepBase:            scale(120 * time.Millisecond),
			StepPerToken:        scale(100 * time.Microsecond),
			StepPerContextToken: scale(200 * time.Nanosecond),
			AsyncScheduling:     true,
		},
	}
}
