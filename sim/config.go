// Package sim is a simulated model server: one fake GPU replica that speaks
// the OpenAI completions/chat API, SGLang's /generate and vLLM's metric
// names, with a configurable service-time model (concurrency, FIFO queue,
// fixed / lognormal / per-token latency) and injectable faults (errors,
// stalls). It stands in for real inference replicas in Sluice's quick start,
// tests and benchmarks.
//
// Every request is served on the goroutine of its HTTP handler, waiting on
// timers and channels, so thousands of concurrent simulated requests are
// cheap, and a client that goes away frees its slot or queue place
// immediately. The simulator starts no goroutines of its own, except with
// LatencyEngine: that replica runs one step loop while it has requests (it
// exits when the replica is idle or closed).
package sim

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// LatencyKind selects the service-time model of a replica.
type LatencyKind string

// The service-time models.
const (
	// LatencyFixed serves every request in exactly Latency.Duration (plus
	// Latency.PrefillPerToken × uncached prompt tokens, before the first
	// token).
	LatencyFixed LatencyKind = "fixed"
	// LatencyLognormal draws each request's service time from a lognormal
	// distribution whose mean is Latency.Duration and whose log-space
	// standard deviation is Latency.Sigma (plus, as for fixed,
	// Latency.PrefillPerToken × uncached prompt tokens before the first token).
	LatencyLognormal LatencyKind = "lognormal"
	// LatencyPerToken charges Latency.Prefill per uncached prompt token (all
	// prompt tokens unless Config.PrefixCache is on) before the first token,
	// then Latency.Decode per further output token, each decode step slowed
	// by the batch: step = Decode × (1 + BatchSlowdown × (running − 1)),
	// where running is the number of requests holding a serving slot when
	// the step is scheduled. The step is re-evaluated at every streamed
	// chunk (StreamChunkTokens tokens) and, for non-streaming requests,
	// about eight times per request (every ⌈output/8⌉ tokens), so every
	// running request slows down as the batch grows and speeds up as it
	// shrinks. Config.PrefillBlocksDecode adds contention between prefills
	// and decodes; Config.KVCapacityTokens admits requests by KV tokens.
	LatencyPerToken LatencyKind = "per_token"
	// LatencyEngine runs the replica as a step-based continuous-batching
	// engine (vLLM V1, transformers continuous batching): one step loop per
	// replica, each step decoding one token for every running request whose
	// prefill is done, then continuing partial prefills and admitting waiting
	// requests FIFO within Config.MaxBatchTokens, the Concurrency cap and the
	// KV blocks (Config.KVBlocks × Config.BlockTokens, with prefix caching).
	// A step lasts Latency.StepBase + Latency.StepPerToken × tokens
	// scheduled in it (prefill and decode) + Latency.StepPerContextToken ×
	// the context those tokens attend to, so every request's tokens slow
	// down as the batch grows while throughput rises.
	// Latency.AsyncScheduling plans each step while the previous one runs.
	// See engine.go.
	LatencyEngine LatencyKind = "engine"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultName         = "sim"
	DefaultModel        = "sim-model"
	DefaultMaxTokens    = 16
	DefaultMaxBodyBytes = 8 << 20
	DefaultErrorStatus  = 500
	// MaxOutputTokens is the largest number of output tokens a request may ask for.
	MaxOutputTokens = 1 << 20
	// MaxKVCapacityTokens is the largest Config.KVCapacityTokens.
	MaxKVCapacityTokens = 1<<31 - 1

	// Defaults of the engine latency model (LatencyEngine).
	DefaultEngineConcurrency    = 256  // vLLM's max_num_seqs
	DefaultEngineKVBlocks       = 4096 // 64k tokens of 16
	DefaultEngineBlockTokens    = 16   // vLLM's block size
	DefaultEngineMaxBatchTokens = 2048
	// MaxKVBlocks, MaxBlockTokens and MaxBatchTokensLimit bound the engine's
	// KVBlocks, BlockTokens and MaxBatchTokens.
	MaxKVBlocks         = 1 << 24
	MaxBlockTokens      = 1 << 16
	MaxBatchTokensLimit = 1 << 24
)

// Latency describes the service-time model. The zero value is "fixed 0":
// requests are answered as soon as they get a serving slot.
type Latency struct {
	// Kind is the model; empty means LatencyFixed.
	Kind LatencyKind `json:"kind,omitempty"`
	// Duration is the service time (fixed) or its mean (lognormal).
	Duration time.Duration `json:"duration,omitempty"`
	// Sigma is the log-space standard deviation (lognormal only), >= 0.
	Sigma float64 `json:"sigma,omitempty"`
	// Prefill is the time per uncached prompt token (per_token only).
	Prefill time.Duration `json:"prefill,omitempty"`
	// PrefillPerToken is the time per uncached prompt token added to the
	// drawn service time of the fixed and lognormal models, before the first
	// token: service = Duration (or the lognormal draw) + PrefillPerToken ×
	// (prompt tokens − cached prompt tokens). Zero (the default) adds
	// nothing. Invalid with per_token, whose Prefill plays this role.
	PrefillPerToken time.Duration `json:"prefill_per_token,omitempty"`
	// Decode is the time per output token with a batch of one (per_token only).
	Decode time.Duration `json:"decode,omitempty"`
	// BatchSlowdown is the relative slowdown of a decode step per additional
	// running request (per_token only), >= 0.
	BatchSlowdown float64 `json:"batch_slowdown,omitempty"`
	// StepBase is the fixed cost of one engine step (engine only): the
	// part of a step's time that does not depend on how many tokens it
	// schedules (weights read, launch and scheduling overhead).
	StepBase time.Duration `json:"step_base,omitempty"`
	// StepPerToken is the cost of each token scheduled in an engine step
	// (engine only), prefill and decode tokens alike: step time = StepBase +
	// StepPerToken × tokens (+ StepPerContextToken × context).
	StepPerToken time.Duration `json:"step_per_token,omitempty"`
	// StepPerContextToken is the cost of each token of context that the
	// step's requests attend to (engine only): attention reads the KV of
	// every scheduled request, its cached prefix included, so a decode of a
	// request holding 1,500 tokens costs 1,500 × StepPerContextToken on top
	// of StepPerToken, and a prefill chunk costs its context up to the
	// chunk's end. Step time = StepBase + StepPerToken × tokens scheduled +
	// StepPerContextToken × Σ context of the scheduled requests. Default 0:
	// the step time does not depend on context lengths.
	StepPerContextToken time.Duration `json:"step_per_context_token,omitempty"`
	// AsyncScheduling makes the engine plan each step while the previous
	// one runs (engine only), as transformers' continuous batching with
	// async batching and vLLM's async scheduling do to hide the host's work
	// behind the GPU's: the plan of step k+1 is made when step k starts, so
	// it admits only the requests that had arrived by then; a request
	// arriving during step k joins step k+2 at the earliest (about one step
	// more to its first token). An engine with nothing in flight plans at
	// once. Default false: a step is planned when the previous one ends,
	// with every request that has arrived.
	AsyncScheduling bool `json:"async_scheduling,omitempty"`
}

// Faults are the injected failures of a replica. They can be changed at run
// time with (*Replica).SetFaults.
//
// An injected error is decided when the request arrives and is answered
// immediately, without queueing or taking a serving slot (a fast-failing
// replica). A stall is decided when the request gets its serving slot: the
// request then holds the slot (it counts as running) for Stall, or until the
// client goes away or SetFaults is called with StallRate 0, and is then
// served normally. With LatencyEngine a stall is decided on arrival and
// comes before the engine's queue: the stalled request holds no seat and
// no KV blocks, and counts neither as running nor as waiting. Either way
// a stream's headers (StreamHeadersImmediate) go out before the stall.
type Faults struct {
	// ErrorRate is the probability (0..1) that a request gets ErrorStatus.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// ErrorStatus is the status of injected errors (400..599); 0 means 500.
	ErrorStatus int `json:"error_status,omitempty"`
	// StallRate is the probability (0..1) that a request stalls.
	StallRate float64 `json:"stall_rate,omitempty"`
	// Stall is how long a stalled request hangs; required if StallRate > 0.
	Stall time.Duration `json:"stall,omitempty"`
}

// Default and limits of PrefixCache.
const (
	DefaultBlockChars = 256
	MaxPrefixBlocks   = 1 << 24
	MaxBlockChars     = 1 << 20
)

// PrefixCache configures a replica's prefix cache, a model of vLLM's
// automatic prefix caching on the prompt text: the text is cut into blocks
// of BlockChars characters (≈ BlockChars/4 tokens), the cache holds up to
// Blocks of them in LRU order, and a request's cached prefix is the longest
// run of its leading full blocks found in the cache, where a block matches
// only if the whole text up to its end matches. Its prefill is charged for
// the uncached prompt tokens only:
//
//	cached tokens   = min(⌊prompt tokens × cached chars / text chars⌋, prompt tokens − 1)
//	uncached tokens = prompt tokens − cached tokens
//
// where cached chars = hit blocks × BlockChars and text chars is the length
// of the rendered prompt text below (prompt tokens are counted as before:
// content characters / 4 plus token ids). Like vLLM, the last prompt token
// is always computed.
//
// A request's blocks are looked up when its service begins (it has a
// serving slot, and any injected stall is over), stored (inserted, or
// touched as most recently used) once its prefill is done, and touched
// again when it ends, served or cancelled; a request cancelled before the
// end of its prefill stores nothing. Concurrent requests can thus reuse a
// prefix as soon as one of them has prefilled it.
//
// The prompt text is the completion prompt or /generate text (arrays of
// strings joined by "\n", token ids in decimal joined by " "), or the chat
// messages rendered as "<|role|>\ncontent\n" in order — the conventions of
// the router's request parser.
type PrefixCache struct {
	// Blocks is the capacity in blocks; 0 disables the cache.
	Blocks int `json:"blocks,omitempty"`
	// BlockChars is the size of a block in characters of prompt text.
	// Default 256.
	BlockChars int `json:"block_chars,omitempty"`
}

// Enabled reports whether the cache is on.
func (p PrefixCache) Enabled() bool { return p.Blocks > 0 }

// Validate reports the first invalid field of p, naming it.
func (p PrefixCache) Validate() error {
	if p.Blocks < 0 || p.Blocks > MaxPrefixBlocks {
		return fmt.Errorf("sim: PrefixCache.Blocks must be between 0 and %d, got %d", MaxPrefixBlocks, p.Blocks)
	}
	if p.BlockChars < 0 || p.BlockChars > MaxBlockChars {
		return fmt.Errorf("sim: PrefixCache.BlockChars must be between 1 and %d, got %d", MaxBlockChars, p.BlockChars)
	}
	if p.BlockChars > 0 && p.Blocks == 0 {
		return fmt.Errorf("sim: PrefixCache.BlockChars is set (%d) but PrefixCache.Blocks is 0", p.BlockChars)
	}
	return nil
}

// Config configures one simulated replica. Zero values mean the defaults.
type Config struct {
	// Name identifies the replica; it is sent in the X-Sim-Replica header of
	// every response. Default "sim".
	Name string `json:"name,omitempty"`
	// Model is the model id listed by /v1/models and used in responses
	// when the request names none. Default "sim-model".
	Model string `json:"model,omitempty"`
	// Concurrency is how many requests are served at once (1 = one at a
	// time, diffusion-like); the others wait in a FIFO queue. It is vLLM's
	// max_num_seqs (the size of the running batch). Default 1, or 256 with
	// LatencyEngine.
	Concurrency int `json:"concurrency,omitempty"`
	// PrefixCache, when Blocks > 0, gives the replica a prefix (KV) cache
	// that shortens the prefill of requests whose prompt starts like a
	// recent one. The zero value disables it.
	PrefixCache PrefixCache `json:"prefix_cache,omitzero"`
	// Latency is the service-time model.
	Latency Latency `json:"latency,omitzero"`
	// GPU, with LatencyEngine, is an accelerator this engine shares with
	// others (co-located replicas): their steps' GPU work takes turns on
	// it. Nil: a GPU of its own.
	GPU *GPU `json:"-"`
	// PrefillBlocksDecode, with the per_token latency model (invalid with
	// the others), makes prefills and decodes contend as in an engine
	// without chunked prefill. The replica runs one prefill at a time:
	// a request that has its serving slot waits, in FIFO order, until no
	// other request of the replica is prefilling (it counts as running
	// meanwhile, as it holds a slot), then prefills for Latency.Prefill ×
	// uncached prompt tokens; its first token comes at the end of its
	// prefill. While a prefill runs, the decode of every other running
	// request pauses: each of its decode waits (one per streamed chunk, or
	// about eight per non-streaming request, see LatencyPerToken) lasts its
	// decode time plus the prefill time overlapping the request's decode
	// phase, so a heavy prompt delays the output of everything batched with
	// it by its whole prefill. A prefill whose client goes away ends at
	// once and the next one starts. A zero prefill (Latency.Prefill 0)
	// takes no turn. Stats reports Prefilling, PrefillWaiting,
	// MaxPrefilling (at most 1), Prefills and DecodeStall. Default false:
	// prefills of different requests overlap freely and never slow decodes.
	PrefillBlocksDecode bool `json:"prefill_blocks_decode,omitempty"`
	// KVCapacityTokens, when > 0, gives the replica a KV cache of that many
	// tokens, as vLLM's scheduler admits requests by free KV blocks: a
	// request holds its prompt tokens from the moment it gets a serving
	// slot, plus each output token as it is generated (per streamed chunk,
	// or about eight times per non-streaming per_token request, or at the
	// end of a non-streaming fixed/lognormal one), and gives them all back
	// when it ends. A queued request starts only when a slot is free
	// (Concurrency still caps the running count) and its prompt tokens fit
	// in the capacity left by the running requests; the queue stays strictly
	// FIFO, so a head request that does not fit holds back the ones behind
	// it (they all count in num_requests_waiting). A prompt larger than the
	// whole capacity is not rejected: it starts alone, once nothing else
	// runs. Running requests are never preempted, so generated tokens can
	// take the usage above the capacity; admissions then wait until enough
	// requests have ended. vllm:kv_cache_usage_perc and
	// vllm:gpu_cache_usage_perc report the held tokens / capacity, clamped
	// to 1 (instead of running / concurrency or the prefix cache's
	// occupancy), and Stats KVTokens / KVCapacityTokens. Applies to every
	// latency model; at most MaxKVCapacityTokens. Default 0: off, requests
	// are admitted by Concurrency alone.
	KVCapacityTokens int `json:"kv_capacity_tokens,omitempty"`
	// KVBlocks is the engine's KV cache in blocks of BlockTokens tokens
	// (LatencyEngine only; invalid with the other models). Default 4096.
	KVBlocks int `json:"kv_blocks,omitempty"`
	// BlockTokens is the size of a KV block in tokens (LatencyEngine only).
	// Prefix caching matches whole blocks of BlockTokens × 4 characters of
	// prompt text (the simulator counts 4 characters per token). Default 16.
	BlockTokens int `json:"block_tokens,omitempty"`
	// MaxBatchTokens is the token budget of one engine step, prefill and
	// decode tokens together (vLLM's max_num_batched_tokens; LatencyEngine
	// only). Prefills longer than what is left of it are chunked across
	// steps. At least Concurrency, so that every running request can decode
	// in every step. Default 2048.
	MaxBatchTokens int `json:"max_batch_tokens,omitempty"`
	// MaxTokens is the number of output tokens when the request does not
	// say (max_tokens / max_completion_tokens / sampling_params.max_new_tokens).
	// Default 16.
	MaxTokens int `json:"max_tokens,omitempty"`
	// StreamChunkTokens is how many tokens each streamed chunk carries.
	// Default 1 (one SSE event per token).
	StreamChunkTokens int `json:"stream_chunk_tokens,omitempty"`
	// StreamHeaders is when a streamed answer's status and headers are
	// sent: StreamHeadersImmediate (the default: as soon as the request is
	// accepted, before it queues or prefills, as vLLM's, SGLang's and
	// TGI's HTTP servers do; X-Sim-Seq and X-Sim-Cached-Tokens, known only
	// once it is admitted, then come as HTTP trailers) or
	// StreamHeadersFirstToken (with the first token, all of them headers;
	// a proxy's first byte then carries the queue and the prefill).
	StreamHeaders string `json:"stream_headers,omitempty"`
	// MaxBodyBytes caps request bodies; larger ones get 413. Default 8 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// Faults are the initial injected faults.
	Faults Faults `json:"faults,omitzero"`
	// Seed seeds the random draws (errors, stalls, lognormal latency) for
	// reproducible runs; 0 picks a random seed.
	Seed uint64 `json:"seed,omitempty"`
}

// withDefaults returns c with the zero-valued fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	engine := c.Latency.Kind == LatencyEngine
	if c.Concurrency == 0 {
		c.Concurrency = 1
		if engine {
			c.Concurrency = DefaultEngineConcurrency
		}
	}
	if engine {
		if c.KVBlocks == 0 {
			c.KVBlocks = DefaultEngineKVBlocks
		}
		if c.BlockTokens == 0 {
			c.BlockTokens = DefaultEngineBlockTokens
		}
		if c.MaxBatchTokens == 0 {
			c.MaxBatchTokens = DefaultEngineMaxBatchTokens
		}
	}
	if c.PrefixCache.Enabled() && c.PrefixCache.BlockChars == 0 {
		c.PrefixCache.BlockChars = DefaultBlockChars
	}
	if c.Latency.Kind == "" {
		c.Latency.Kind = LatencyFixed
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultMaxTokens
	}
	if c.StreamChunkTokens == 0 {
		c.StreamChunkTokens = 1
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	c.Faults = c.Faults.withDefaults()
	return c
}

func (f Faults) withDefaults() Faults {
	if f.ErrorStatus == 0 {
		f.ErrorStatus = DefaultErrorStatus
	}
	return f
}

// Validate reports the first invalid field of c, naming it. Zero values are
// valid (they mean the defaults).
func (c Config) Validate() error {
	if err := checkLabel("Name", c.Name); err != nil {
		return err
	}
	if err := checkLabel("Model", c.Model); err != nil {
		return err
	}
	if c.Concurrency < 0 {
		return fmt.Errorf("sim: Concurrency must be at least 1, got %d", c.Concurrency)
	}
	if err := c.Latency.Validate(); err != nil {
		return err
	}
	if c.PrefillBlocksDecode && c.Latency.Kind != LatencyPerToken {
		kind := c.Latency.Kind
		if kind == "" {
			kind = LatencyFixed
		}
		return fmt.Errorf("sim: PrefillBlocksDecode needs Latency.Kind %q, got %q", LatencyPerToken, kind)
	}
	if err := c.validateEngine(); err != nil {
		return err
	}
	if c.GPU != nil && c.Latency.Kind != LatencyEngine {
		return fmt.Errorf("sim: GPU (a shared GPU) needs Latency.Kind %q, got %q", LatencyEngine, c.Latency.Kind)
	}
	if c.KVCapacityTokens < 0 || c.KVCapacityTokens > MaxKVCapacityTokens {
		return fmt.Errorf("sim: KVCapacityTokens must be between 0 (off) and %d, got %d", MaxKVCapacityTokens, c.KVCapacityTokens)
	}
	if err := c.PrefixCache.Validate(); err != nil {
		return err
	}
	if c.MaxTokens < 0 || c.MaxTokens > MaxOutputTokens {
		return fmt.Errorf("sim: MaxTokens must be between 1 and %d, got %d", MaxOutputTokens, c.MaxTokens)
	}
	if c.StreamChunkTokens < 0 {
		return fmt.Errorf("sim: StreamChunkTokens must be at least 1, got %d", c.StreamChunkTokens)
	}
	switch c.StreamHeaders {
	case "", StreamHeadersFirstToken, StreamHeadersImmediate:
	default:
		return fmt.Errorf("sim: StreamHeaders must be %q or %q, got %q", StreamHeadersFirstToken, StreamHeadersImmediate, c.StreamHeaders)
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("sim: MaxBodyBytes must be positive, got %d", c.MaxBodyBytes)
	}
	return c.Faults.Validate()
}

// Validate reports the first invalid field of l, naming it.
func (l Latency) Validate() error {
	if l.PrefillPerToken < 0 {
		return fmt.Errorf("sim: Latency.PrefillPerToken must not be negative, got %v", l.PrefillPerToken)
	}
	switch l.Kind {
	case "", LatencyFixed:
		if l.Duration < 0 {
			return fmt.Errorf("sim: Latency.Duration must not be negative, got %v", l.Duration)
		}
	case LatencyLognormal:
		if l.Duration <= 0 {
			return fmt.Errorf("sim: Latency.Duration (the lognormal mean) must be positive, got %v", l.Duration)
		}
		if !(l.Sigma >= 0 && l.Sigma <= 10) {
			return fmt.Errorf("sim: Latency.Sigma must be between 0 and 10, got %v", l.Sigma)
		}
	case LatencyPerToken:
		if l.PrefillPerToken != 0 {
			return fmt.Errorf("sim: Latency.PrefillPerToken is for the fixed and lognormal models; per_token uses Latency.Prefill")
		}
		if l.Prefill < 0 {
			return fmt.Errorf("sim: Latency.Prefill must not be negative, got %v", l.Prefill)
		}
		if l.Decode < 0 {
			return fmt.Errorf("sim: Latency.Decode must not be negative, got %v", l.Decode)
		}
		if !(l.BatchSlowdown >= 0 && l.BatchSlowdown <= 1e6) {
			return fmt.Errorf("sim: Latency.BatchSlowdown must be between 0 and 1e6, got %v", l.BatchSlowdown)
		}
	case LatencyEngine:
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"Duration", l.Duration != 0}, {"Sigma", l.Sigma != 0}, {"Prefill", l.Prefill != 0},
			{"PrefillPerToken", l.PrefillPerToken != 0}, {"Decode", l.Decode != 0}, {"BatchSlowdown", l.BatchSlowdown != 0},
		} {
			if f.set {
				return fmt.Errorf("sim: Latency.%s is not for Latency.Kind %q, which uses Latency.StepBase, Latency.StepPerToken and Latency.StepPerContextToken", f.name, LatencyEngine)
			}
		}
		if l.StepBase < 0 {
			return fmt.Errorf("sim: Latency.StepBase must not be negative, got %v", l.StepBase)
		}
		if l.StepPerToken < 0 {
			return fmt.Errorf("sim: Latency.StepPerToken must not be negative, got %v", l.StepPerToken)
		}
		if l.StepPerContextToken < 0 {
			return fmt.Errorf("sim: Latency.StepPerContextToken must not be negative, got %v", l.StepPerContextToken)
		}
		return nil
	default:
		return fmt.Errorf("sim: Latency.Kind must be %q, %q, %q or %q, got %q",
			LatencyFixed, LatencyLognormal, LatencyPerToken, LatencyEngine, l.Kind)
	}
	if l.StepBase != 0 || l.StepPerToken != 0 || l.StepPerContextToken != 0 || l.AsyncScheduling {
		return fmt.Errorf("sim: Latency.StepBase, Latency.StepPerToken, Latency.StepPerContextToken and Latency.AsyncScheduling are for Latency.Kind %q", LatencyEngine)
	}
	return nil
}

// validateEngine checks the fields of the engine model: their ranges with
// LatencyEngine, their absence with the other models, and the options the
// engine replaces (PrefixCache, KVCapacityTokens, PrefillBlocksDecode).
func (c Config) validateEngine() error {
	if c.Latency.Kind != LatencyEngine {
		for _, f := range []struct {
			name string
			set  bool
		}{{"KVBlocks", c.KVBlocks != 0}, {"BlockTokens", c.BlockTokens != 0}, {"MaxBatchTokens", c.MaxBatchTokens != 0}} {
			if f.set {
				return fmt.Errorf("sim: %s is for Latency.Kind %q", f.name, LatencyEngine)
			}
		}
		return nil
	}
	if c.KVBlocks < 0 || c.KVBlocks > MaxKVBlocks {
		return fmt.Errorf("sim: KVBlocks must be between 1 and %d, got %d", MaxKVBlocks, c.KVBlocks)
	}
	if c.BlockTokens < 0 || c.BlockTokens > MaxBlockTokens {
		return fmt.Errorf("sim: BlockTokens must be between 1 and %d, got %d", MaxBlockTokens, c.BlockTokens)
	}
	if c.MaxBatchTokens < 0 || c.MaxBatchTokens > MaxBatchTokensLimit {
		return fmt.Errorf("sim: MaxBatchTokens must be between 1 and %d, got %d", MaxBatchTokensLimit, c.MaxBatchTokens)
	}
	d := c.withDefaults()
	if d.MaxBatchTokens < d.Concurrency {
		return fmt.Errorf("sim: MaxBatchTokens (%d) must be at least Concurrency (%d), so that every running request decodes in every step",
			d.MaxBatchTokens, d.Concurrency)
	}
	if c.PrefixCache.Blocks != 0 || c.PrefixCache.BlockChars != 0 {
		return fmt.Errorf("sim: PrefixCache is not for Latency.Kind %q: the engine caches prefixes in its KV blocks (KVBlocks, BlockTokens)", LatencyEngine)
	}
	if c.KVCapacityTokens != 0 {
		return fmt.Errorf("sim: KVCapacityTokens is not for Latency.Kind %q: the engine admits by KVBlocks", LatencyEngine)
	}
	return nil
}

// Validate reports the first invalid field of f, naming it.
func (f Faults) Validate() error {
	if !(f.ErrorRate >= 0 && f.ErrorRate <= 1) {
		return fmt.Errorf("sim: Faults.ErrorRate must be between 0 and 1, got %v", f.ErrorRate)
	}
	if f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599) {
		return fmt.Errorf("sim: Faults.ErrorStatus must be between 400 and 599, got %d", f.ErrorStatus)
	}
	if !(f.StallRate >= 0 && f.StallRate <= 1) {
		return fmt.Errorf("sim: Faults.StallRate must be between 0 and 1, got %v", f.StallRate)
	}
	if f.Stall < 0 {
		return fmt.Errorf("sim: Faults.Stall must not be negative, got %v", f.Stall)
	}
	if f.StallRate > 0 && f.Stall == 0 {
		return fmt.Errorf("sim: Faults.Stall must be positive when Faults.StallRate is %v", f.StallRate)
	}
	return nil
}

// checkLabel rejects strings that cannot go into a header or a Prometheus
// label value unescaped.
func checkLabel(field, s string) error {
	if len(s) > 256 {
		return fmt.Errorf("sim: %s is longer than 256 bytes", field)
	}
	if i := strings.IndexFunc(s, func(r rune) bool {
		return r < 0x20 || r == 0x7f || r == '"' || r == '\\' || r > 0x7e
	}); i >= 0 {
		return fmt.Errorf("sim: %s %q contains a character that is not printable ASCII or is a quote/backslash", field, s)
	}
	return nil
}

// lognormalMu returns the log-space location giving the distribution the
// requested mean: mean = exp(mu + sigma²/2).
func lognormalMu(mean time.Duration, sigma float64) float64 {
	return math.Log(float64(mean)) - sigma*sigma/2
}
