package caddymodule

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluice-router/sluice/sim"
)

// InferenceSim is a simulated model replica served as a terminal HTTP
// handler: it answers OpenAI-compatible /v1/completions,
// /v1/chat/completions and /v1/models, SGLang-style /generate, /health and
// /metrics (vLLM metric names) itself and never calls the next handler. It
// stands in for GPU replicas in the quick start, tests and benchmarks. See
// package sim for the service-time model and the faults.
//
// A config reload builds a fresh replica (new queue and counters); requests
// still in flight on the old one finish there.
type InferenceSim struct {
	// Name of the replica, sent in the X-Sim-Replica response header.
	// Default "sim".
	Name string `json:"name,omitempty"`
	// Model id listed by /v1/models. Default "sim-model".
	Model string `json:"model,omitempty"`
	// Concurrency is how many requests are served at once (vLLM's
	// max_num_seqs; the Caddyfile accepts both names); the others wait in a
	// FIFO queue. Default 1.
	Concurrency int `json:"concurrency,omitempty"`
	// PrefixCache gives the replica an LRU prefix (KV) cache, so that
	// requests whose prompt starts like a recent one have a shorter
	// prefill. Default: none.
	PrefixCache *InferenceSimPrefixCache `json:"prefix_cache,omitempty"`
	// Latency is the service-time model. Default: fixed 0.
	Latency *InferenceSimLatency `json:"latency,omitempty"`
	// PrefillBlocksDecode (per_token latency only) runs one prefill at a
	// time on the replica and pauses the decode of the other running
	// requests while it runs, as an engine without chunked prefill does
	// (see sim.Config.PrefillBlocksDecode). Default false.
	PrefillBlocksDecode bool `json:"prefill_blocks_decode,omitempty"`
	// KVCapacityTokens, when > 0, is the replica's KV cache in tokens: a
	// request starts only when its prompt tokens fit next to the prompt and
	// generated tokens of the running requests (a prompt larger than the
	// capacity starts alone), and the KV usage metrics report held tokens /
	// capacity (see sim.Config.KVCapacityTokens). Default 0: off.
	KVCapacityTokens int `json:"kv_capacity_tokens,omitempty"`
	// KVBlocks, BlockTokens and MaxBatchTokens shape the engine latency
	// model (latency engine only): its KV cache in blocks, the block size
	// in tokens, and the token budget of one step (see sim.Config).
	// Defaults 4096, 16 and 2048.
	KVBlocks       int `json:"kv_blocks,omitempty"`
	BlockTokens    int `json:"block_tokens,omitempty"`
	MaxBatchTokens int `json:"max_batch_tokens,omitempty"`
	// Preset starts from a named configuration, which the other fields
	// then override: "calibrated_engine" is sim.CalibratedEngine, an engine
	// fitted to a measured H100 engine, its durations multiplied by
	// PresetTimeScale (default 1: real time).
	Preset          string  `json:"preset,omitempty"`
	PresetTimeScale float64 `json:"preset_time_scale,omitempty"`
	// MaxTokens is the output length when a request does not say. Default 16.
	MaxTokens int `json:"max_tokens,omitempty"`
	// StreamChunkTokens is the number of tokens per streamed chunk. Default 1.
	StreamChunkTokens int `json:"stream_chunk_tokens,omitempty"`
	// StreamHeaders is when a stream's status and headers are sent:
	// immediate (the default: as soon as the request is accepted, before it
	// queues or prefills, as vLLM's and SGLang's servers do; X-Sim-Seq and
	// X-Sim-Cached-Tokens then come as HTTP trailers) or first_token (with
	// the first token).
	StreamHeaders string `json:"stream_headers,omitempty"`
	// MaxBodyBytes caps request bodies (413 above). Default 8 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// ErrorRate is the probability (0..1) of answering with ErrorStatus
	// immediately, without queueing.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// ErrorStatus is the status of injected errors (400..599). Default 500.
	ErrorStatus int `json:"error_status,omitempty"`
	// StallRate is the probability (0..1) that a request, once it has a
	// serving slot, hangs for Stall before being served.
	StallRate float64 `json:"stall_rate,omitempty"`
	// Stall is the duration of a stall.
	Stall caddy.Duration `json:"stall,omitempty"`
	// Seed makes the random draws reproducible; 0 picks a random seed.
	Seed uint64 `json:"seed,omitempty"`

	replica *sim.Replica
}

// InferenceSimPrefixCache is the JSON form of the prefix cache (see
// sim.PrefixCache).
type InferenceSimPrefixCache struct {
	// Blocks is the capacity in blocks (> 0).
	Blocks int `json:"blocks,omitempty"`
	// BlockChars is the block size in characters of prompt text (≈ 4 per
	// token). Default 256.
	BlockChars int `json:"block_chars,omitempty"`
}

// InferenceSimLatency is the JSON form of the service-time model.
type InferenceSimLatency struct {
	// Kind is "fixed" (default), "lognormal", "per_token" or "engine".
	Kind string `json:"kind,omitempty"`
	// Duration is the service time (fixed) or its mean (lognormal).
	Duration caddy.Duration `json:"duration,omitempty"`
	// Sigma is the log-space standard deviation (lognormal).
	Sigma float64 `json:"sigma,omitempty"`
	// Prefill is the time per uncached prompt token (per_token).
	Prefill caddy.Duration `json:"prefill,omitempty"`
	// PrefillPerToken is the time per uncached prompt token added before
	// the first token of the fixed and lognormal models.
	PrefillPerToken caddy.Duration `json:"prefill_per_token,omitempty"`
	// Decode is the time per output token with a batch of one (per_token).
	Decode caddy.Duration `json:"decode,omitempty"`
	// BatchSlowdown slows each decode step by this fraction per additional
	// running request (per_token).
	BatchSlowdown float64 `json:"batch_slowdown,omitempty"`
	// StepBase and StepPerToken are the engine's step time: StepBase +
	// StepPerToken × tokens scheduled in the step (engine).
	StepBase     caddy.Duration `json:"step_base,omitempty"`
	StepPerToken caddy.Duration `json:"step_per_token,omitempty"`
}

// PresetCalibratedEngine names sim.CalibratedEngine as an inference_sim preset.
const PresetCalibratedEngine = "calibrated_engine"

// CaddyModule returns the Caddy module information.
func (InferenceSim) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("http.handlers.inference_sim", func() caddy.Module { return new(InferenceSim) })
}

// simConfig converts the module's fields to a sim.Config, on top of the
// preset if one is named.
func (s *InferenceSim) simConfig() sim.Config {
	cfg := s.ownConfig()
	if s.Preset != PresetCalibratedEngine {
		return cfg
	}
	scale := s.PresetTimeScale
	if scale == 0 {
		scale = 1
	}
	p := sim.CalibratedEngine(scale)
	p.Name, p.Model = cfg.Name, cfg.Model // the replica's identity is not the preset's
	// The module's set (non-zero) fields override the preset's.
	if cfg.Latency == (sim.Latency{}) {
		cfg.Latency = p.Latency
	}
	for _, f := range []struct{ own, preset *int }{
		{&cfg.Concurrency, &p.Concurrency}, {&cfg.KVBlocks, &p.KVBlocks}, {&cfg.BlockTokens, &p.BlockTokens},
		{&cfg.MaxBatchTokens, &p.MaxBatchTokens}, {&cfg.MaxTokens, &p.MaxTokens}, {&cfg.StreamChunkTokens, &p.StreamChunkTokens},
	} {
		if *f.own == 0 {
			*f.own = *f.preset
		}
	}
	return cfg
}

// validStreamHeaders checks stream_headers ("" is the default).
func validStreamHeaders(v string) error {
	switch v {
	case "", sim.StreamHeadersFirstToken, sim.StreamHeadersImmediate:
		return nil
	}
	return fmt.Errorf("inference_sim: stream_headers %q: want %s (the default: at once, as vLLM and SGLang) or %s (with the first token)",
		v, sim.StreamHeadersImmediate, sim.StreamHeadersFirstToken)
}

// ownConfig converts the module's own fields to a sim.Config.
func (s *InferenceSim) ownConfig() sim.Config {
	cfg := sim.Config{
		Name:                s.Name,
		Model:               s.Model,
		Concurrency:         s.Concurrency,
		MaxTokens:           s.MaxTokens,
		StreamChunkTokens:   s.StreamChunkTokens,
		StreamHeaders:       s.StreamHeaders,
		MaxBodyBytes:        s.MaxBodyBytes,
		PrefillBlocksDecode: s.PrefillBlocksDecode,
		KVCapacityTokens:    s.KVCapacityTokens,
		KVBlocks:            s.KVBlocks,
		BlockTokens:         s.BlockTokens,
		MaxBatchTokens:      s.MaxBatchTokens,
		Faults: sim.Faults{
			ErrorRate:   s.ErrorRate,
			ErrorStatus: s.ErrorStatus,
			StallRate:   s.StallRate,
			Stall:       time.Duration(s.Stall),
		},
		Seed: s.Seed,
	}
	if l := s.Latency; l != nil {
		cfg.Latency = sim.Latency{
			Kind:            sim.LatencyKind(l.Kind),
			Duration:        time.Duration(l.Duration),
			Sigma:           l.Sigma,
			Prefill:         time.Duration(l.Prefill),
			PrefillPerToken: time.Duration(l.PrefillPerToken),
			Decode:          time.Duration(l.Decode),
			BatchSlowdown:   l.BatchSlowdown,
			StepBase:        time.Duration(l.StepBase),
			StepPerToken:    time.Duration(l.StepPerToken),
		}
	}
	if p := s.PrefixCache; p != nil {
		cfg.PrefixCache = sim.PrefixCache{Blocks: p.Blocks, BlockChars: p.BlockChars}
	}
	return cfg
}

func (s *InferenceSim) validatePreset() error {
	if s.Preset != "" && s.Preset != PresetCalibratedEngine {
		return fmt.Errorf("inference_sim: preset %q is unknown: want %q", s.Preset, PresetCalibratedEngine)
	}
	if !(s.PresetTimeScale >= 0 && s.PresetTimeScale <= 1000) {
		return fmt.Errorf("inference_sim: preset_time_scale must be between 0 (1, real time) and 1000, got %v", s.PresetTimeScale)
	}
	if s.PresetTimeScale != 0 && s.Preset == "" {
		return fmt.Errorf("inference_sim: preset_time_scale is set (%v) but no preset is named", s.PresetTimeScale)
	}
	return nil
}

// Provision builds the simulated replica.
func (s *InferenceSim) Provision(caddy.Context) error {
	if err := s.validatePreset(); err != nil {
		return err
	}
	rp, err := sim.New(s.simConfig())
	if err != nil {
		return fmt.Errorf("inference_sim: %w", err)
	}
	s.replica = rp
	inferenceSimRegistry.put(rp)
	return nil
}

// Validate checks the configuration.
func (s *InferenceSim) Validate() error {
	if err := s.validatePreset(); err != nil {
		return err
	}
	if err := validStreamHeaders(s.StreamHeaders); err != nil {
		return err
	}
	if err := s.simConfig().Validate(); err != nil {
		return fmt.Errorf("inference_sim: %w", err)
	}
	return nil
}

// Cleanup unregisters the replica. It does not abort requests in flight:
// they finish on the replica that accepted them.
func (s *InferenceSim) Cleanup() error {
	if s.replica != nil {
		inferenceSimRegistry.remove(s.replica)
	}
	return nil
}

// ServeHTTP answers the request with the simulated replica; it never calls
// next.
func (s *InferenceSim) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	s.replica.ServeHTTP(w, r)
	return nil
}

// InferenceSimReplica returns the most recently provisioned inference_sim
// replica with the given name, or nil. Tests use it to change faults at run
// time (SetFaults) or read Stats of a replica served by Caddy.
func InferenceSimReplica(name string) *sim.Replica {
	return inferenceSimRegistry.get(name)
}

var inferenceSimRegistry = &inferenceSimReplicas{byName: make(map[string][]*sim.Replica)}

// inferenceSimReplicas keeps, per name, every provisioned replica not yet
// cleaned up, newest last: across a reload the old config's replica is
// cleaned up after the new one is provisioned, and a refused config's
// after it was provisioned, so a single entry per name would lose the
// running config's replica to a refused reload.
type inferenceSimReplicas struct {
	mu     sync.Mutex
	byName map[string][]*sim.Replica
}

func (reg *inferenceSimReplicas) put(rp *sim.Replica) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	reg.byName[rp.Name()] = append(reg.byName[rp.Name()], rp)
}

func (reg *inferenceSimReplicas) get(name string) *sim.Replica {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if rps := reg.byName[name]; len(rps) > 0 {
		return rps[len(rps)-1]
	}
	return nil
}

func (reg *inferenceSimReplicas) remove(rp *sim.Replica) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	rps := slices.DeleteFunc(reg.byName[rp.Name()], func(r *sim.Replica) bool { return r == rp })
	if len(rps) == 0 {
		delete(reg.byName, rp.Name())
	} else {
		reg.byName[rp.Name()] = rps
	}
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	inference_sim [<name>] {
//	    name         <name>
//	    model        <model id>
//	    concurrency  <n>        (or max_num_seqs <n>, vLLM's name)
//	    latency      fixed <duration>
//	    latency      lognormal <mean> <sigma>
//	    latency      per_token <prefill per token> <decode per token> [batch_slowdown <factor>]
//	    latency      engine <step base> <step per token>
//	    kv_blocks        <n>                   (engine only)
//	    block_tokens     <tokens per block>    (engine only)
//	    max_batch_tokens <tokens per step>     (engine only)
//	    preset       calibrated_engine [<time scale>]
//	    prefill_per_token <duration>          (fixed and lognormal only)
//	    prefix_cache <blocks> [<block chars>]
//	    prefill_blocks_decode on|off          (per_token only)
//	    kv_capacity_tokens <tokens>
//	    max_tokens   <n>
//	    stream_chunk <tokens per chunk>
//	    max_body     <bytes>
//	    error_rate   <0..1>
//	    error_status <400..599>
//	    stall        <duration> <rate 0..1>
//	    seed         <n>
//	}
//
// prefill_blocks_decode on (latency per_token only; default off) makes the
// replica run one prefill at a time, FIFO, and pause the decode steps of its
// other running requests while a prefill runs, so that a long prompt delays
// the tokens of every request batched with it by its whole prefill (an
// engine without chunked prefill).
//
// kv_capacity_tokens <n> (1 or more; default off) gives the replica a KV
// cache of n tokens. A running request holds its prompt tokens plus the
// tokens generated so far; a queued request starts only when a slot is free
// (concurrency still applies) and its prompt tokens fit in what the running
// requests leave, in strict FIFO order (it waits, counted in
// num_requests_waiting, meanwhile). A prompt larger than n is not rejected:
// it starts alone once nothing else runs. vllm:kv_cache_usage_perc and
// vllm:gpu_cache_usage_perc then report held tokens / n, clamped to 1.
//
// latency engine runs a step-based continuous-batching engine (see
// sim.LatencyEngine): every step decodes a token for each running request,
// continues chunked prefills and admits waiting requests FIFO within
// max_batch_tokens, concurrency and kv_blocks (with prefix caching), and
// lasts step base + step per token × tokens scheduled. preset
// calibrated_engine starts from sim.CalibratedEngine (fitted to a measured
// H100 engine), its durations × time scale (default 1); the other options
// override it.
func (s *InferenceSim) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if d.NextArg() {
		s.Name = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	seen := make(map[string]bool)
	var prefillPerToken caddy.Duration // merged into Latency once it is known
	for d.NextBlock(0) {
		sub := d.Val()
		if seen[sub] {
			return d.Errf("inference_sim: %s specified more than once", sub)
		}
		seen[sub] = true
		switch sub {
		case "name", "model":
			var v string
			if !d.AllArgs(&v) {
				return d.Errf("inference_sim: %s takes exactly one value", sub)
			}
			if sub == "name" {
				s.Name = v
			} else {
				s.Model = v
			}
		case "concurrency", "max_num_seqs":
			if seen["concurrency"] && seen["max_num_seqs"] {
				return d.Errf("inference_sim: max_num_seqs is another name for concurrency; give only one of them")
			}
			n, err := inferenceSimInt(d, sub, 1, math.MaxInt32)
			if err != nil {
				return err
			}
			s.Concurrency = n
		case "prefix_cache":
			args := d.RemainingArgs()
			if len(args) != 1 && len(args) != 2 {
				return d.Errf("inference_sim: usage: prefix_cache <blocks> [<block chars>]")
			}
			p := &InferenceSimPrefixCache{}
			n, err := strconv.Atoi(args[0])
			if err != nil || n < 1 || n > sim.MaxPrefixBlocks {
				return d.Errf("inference_sim: prefix_cache blocks %q must be an integer between 1 and %d", args[0], sim.MaxPrefixBlocks)
			}
			p.Blocks = n
			if len(args) == 2 {
				n, err := strconv.Atoi(args[1])
				if err != nil || n < 1 || n > sim.MaxBlockChars {
					return d.Errf("inference_sim: prefix_cache block_chars %q must be an integer between 1 and %d", args[1], sim.MaxBlockChars)
				}
				p.BlockChars = n
			}
			s.PrefixCache = p
		case "prefill_per_token":
			if !d.NextArg() {
				return d.ArgErr()
			}
			v, err := inferenceSimDuration(d, sub, d.Val())
			if err != nil {
				return err
			}
			if d.NextArg() {
				return d.ArgErr()
			}
			prefillPerToken = caddy.Duration(v)
		case "max_tokens":
			n, err := inferenceSimInt(d, sub, 1, sim.MaxOutputTokens)
			if err != nil {
				return err
			}
			s.MaxTokens = n
		case "stream_headers":
			if !d.AllArgs(&s.StreamHeaders) {
				return d.Errf("inference_sim: stream_headers takes exactly one value: %s or %s", sim.StreamHeadersImmediate, sim.StreamHeadersFirstToken)
			}
			if err := validStreamHeaders(s.StreamHeaders); err != nil {
				return d.Err(err.Error())
			}
		case "stream_chunk":
			n, err := inferenceSimInt(d, sub, 1, sim.MaxOutputTokens)
			if err != nil {
				return err
			}
			s.StreamChunkTokens = n
		case "max_body":
			n, err := inferenceSimInt(d, sub, 1, math.MaxInt)
			if err != nil {
				return err
			}
			s.MaxBodyBytes = int64(n)
		case "error_status":
			n, err := inferenceSimInt(d, sub, 400, 599)
			if err != nil {
				return err
			}
			s.ErrorStatus = n
		case "error_rate":
			if !d.NextArg() {
				return d.ArgErr()
			}
			p, err := inferenceSimRate(d, sub, d.Val())
			if err != nil {
				return err
			}
			s.ErrorRate = p
			if d.NextArg() {
				return d.ArgErr()
			}
		case "stall":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("inference_sim: stall needs a duration and a rate, e.g. 'stall 30s 0.01'")
			}
			dur, err := inferenceSimDuration(d, sub, args[0])
			if err != nil {
				return err
			}
			p, err := inferenceSimRate(d, sub, args[1])
			if err != nil {
				return err
			}
			if p > 0 && dur == 0 {
				return d.Errf("inference_sim: stall duration must be positive when the rate is %v", p)
			}
			s.Stall, s.StallRate = caddy.Duration(dur), p
		case "seed":
			if !d.NextArg() {
				return d.ArgErr()
			}
			v, err := strconv.ParseUint(d.Val(), 10, 64)
			if err != nil {
				return d.Errf("inference_sim: seed %q is not an unsigned integer", d.Val())
			}
			s.Seed = v
			if d.NextArg() {
				return d.ArgErr()
			}
		case "prefill_blocks_decode":
			var v string
			if !d.AllArgs(&v) {
				return d.Errf("inference_sim: usage: prefill_blocks_decode on|off")
			}
			switch v {
			case "on":
				s.PrefillBlocksDecode = true
			case "off":
				s.PrefillBlocksDecode = false
			default:
				return d.Errf("inference_sim: prefill_blocks_decode %q must be on or off", v)
			}
		case "kv_capacity_tokens":
			n, err := inferenceSimInt(d, sub, 1, sim.MaxKVCapacityTokens)
			if err != nil {
				return err
			}
			s.KVCapacityTokens = n
		case "kv_blocks", "block_tokens", "max_batch_tokens":
			hi := map[string]int{"kv_blocks": sim.MaxKVBlocks, "block_tokens": sim.MaxBlockTokens, "max_batch_tokens": sim.MaxBatchTokensLimit}[sub]
			n, err := inferenceSimInt(d, sub, 1, hi)
			if err != nil {
				return err
			}
			switch sub {
			case "kv_blocks":
				s.KVBlocks = n
			case "block_tokens":
				s.BlockTokens = n
			default:
				s.MaxBatchTokens = n
			}
		case "preset":
			args := d.RemainingArgs()
			if len(args) != 1 && len(args) != 2 {
				return d.Errf("inference_sim: usage: preset %s [<time scale>]", PresetCalibratedEngine)
			}
			if args[0] != PresetCalibratedEngine {
				return d.Errf("inference_sim: preset %q is unknown: want %s", args[0], PresetCalibratedEngine)
			}
			s.Preset = args[0]
			if len(args) == 2 {
				f, err := strconv.ParseFloat(args[1], 64)
				if err != nil || !(f > 0 && f <= 1000) {
					return d.Errf("inference_sim: preset time scale %q must be a number above 0 and at most 1000", args[1])
				}
				s.PresetTimeScale = f
			}
		case "latency":
			l, err := parseInferenceSimLatency(d)
			if err != nil {
				return err
			}
			s.Latency = l
		default:
			return d.Errf("inference_sim: unrecognized subdirective '%s'", sub)
		}
	}
	if seen["prefill_per_token"] {
		if s.Latency == nil {
			s.Latency = &InferenceSimLatency{} // fixed 0
		}
		if sim.LatencyKind(s.Latency.Kind) == sim.LatencyPerToken {
			return d.Errf("inference_sim: prefill_per_token is for latency fixed or lognormal; " +
				"latency per_token takes the prefill per token as its first value")
		}
		s.Latency.PrefillPerToken = prefillPerToken
	}
	if s.PrefillBlocksDecode && (s.Latency == nil || sim.LatencyKind(s.Latency.Kind) != sim.LatencyPerToken) {
		return d.Errf("inference_sim: prefill_blocks_decode on needs latency per_token")
	}
	return nil
}

// parseInferenceSimLatency parses the arguments of the latency subdirective.
func parseInferenceSimLatency(d *caddyfile.Dispenser) (*InferenceSimLatency, error) {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return nil, d.Errf("inference_sim: latency needs a model: fixed, lognormal, per_token or engine")
	}
	l := &InferenceSimLatency{Kind: args[0]}
	durations := func(names ...string) ([]time.Duration, error) {
		out := make([]time.Duration, len(names))
		for i, name := range names {
			v, err := inferenceSimDuration(d, "latency "+l.Kind+" "+name, args[1+i])
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	switch sim.LatencyKind(args[0]) {
	case sim.LatencyFixed:
		if len(args) != 2 {
			return nil, d.Errf("inference_sim: usage: latency fixed <duration>")
		}
		ds, err := durations("duration")
		if err != nil {
			return nil, err
		}
		l.Duration = caddy.Duration(ds[0])
	case sim.LatencyLognormal:
		if len(args) != 3 {
			return nil, d.Errf("inference_sim: usage: latency lognormal <mean> <sigma>")
		}
		ds, err := durations("mean")
		if err != nil {
			return nil, err
		}
		if ds[0] == 0 {
			return nil, d.Errf("inference_sim: latency lognormal mean must be positive")
		}
		sigma, err := strconv.ParseFloat(args[2], 64)
		if err != nil || !(sigma >= 0 && sigma <= 10) {
			return nil, d.Errf("inference_sim: latency lognormal sigma %q must be a number between 0 and 10", args[2])
		}
		l.Duration, l.Sigma = caddy.Duration(ds[0]), sigma
	case sim.LatencyPerToken:
		if len(args) != 3 && len(args) != 5 {
			return nil, d.Errf("inference_sim: usage: latency per_token <prefill> <decode> [batch_slowdown <factor>]")
		}
		ds, err := durations("prefill", "decode")
		if err != nil {
			return nil, err
		}
		l.Prefill, l.Decode = caddy.Duration(ds[0]), caddy.Duration(ds[1])
		if len(args) == 5 {
			if args[3] != "batch_slowdown" {
				return nil, d.Errf("inference_sim: latency per_token: unexpected %q, want batch_slowdown <factor>", args[3])
			}
			f, err := strconv.ParseFloat(args[4], 64)
			if err != nil || !(f >= 0 && f <= 1e6) {
				return nil, d.Errf("inference_sim: latency per_token batch_slowdown %q must be a non-negative number", args[4])
			}
			l.BatchSlowdown = f
		}
	case sim.LatencyEngine:
		if len(args) != 3 {
			return nil, d.Errf("inference_sim: usage: latency engine <step base> <step per token>")
		}
		ds, err := durations("step_base", "step_per_token")
		if err != nil {
			return nil, err
		}
		l.StepBase, l.StepPerToken = caddy.Duration(ds[0]), caddy.Duration(ds[1])
	default:
		return nil, d.Errf("inference_sim: unknown latency model %q: want fixed, lognormal, per_token or engine", args[0])
	}
	return l, nil
}

// inferenceSimInt reads the single integer argument of subdirective sub.
func inferenceSimInt(d *caddyfile.Dispenser, sub string, lo, hi int) (int, error) {
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	n, err := strconv.Atoi(d.Val())
	if err != nil || n < lo || n > hi {
		return 0, d.Errf("inference_sim: %s %q must be an integer between %d and %d", sub, d.Val(), lo, hi)
	}
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return n, nil
}

func inferenceSimRate(d *caddyfile.Dispenser, sub, arg string) (float64, error) {
	p, err := strconv.ParseFloat(arg, 64)
	if err != nil || !(p >= 0 && p <= 1) {
		return 0, d.Errf("inference_sim: %s rate %q must be a number between 0 and 1", sub, arg)
	}
	return p, nil
}

func inferenceSimDuration(d *caddyfile.Dispenser, what, arg string) (time.Duration, error) {
	v, err := caddy.ParseDuration(arg)
	if err != nil {
		return 0, d.Errf("inference_sim: %s %q is not a duration: %v", what, arg, err)
	}
	if v < 0 {
		return 0, d.Errf("inference_sim: %s %q must not be negative", what, arg)
	}
	return v, nil
}
