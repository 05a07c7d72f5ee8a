package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// ---- real-engine, engine-calibration -------------------------------------

// The measured engine and its workload:
// ../shared/real-engine/2026-11-24-h100-transformers.md (relative to the
// repository root): one H100, transformers 5.17 continuous batching, a
// 3B-parameter Llama-shaped model with random weights; 4 shared system
// prompts of 1,500 words + 40 unique words, 32 output tokens, streamed,
// Poisson arrivals for 25 s, 40 s client timeout.

// EngineOptions configure the real-engine and engine-calibration scenarios.
// Zero values mean the defaults (the measured workload).
type EngineOptions struct {
	// Engine is where the replicas come from when Endpoints is empty:
	// "sim" (default: in-process simulated engines), "transformers" (R
	// copies of bench/realengine/server.py, started and stopped by the
	// harness; needs PyTorch + transformers, and a GPU to mean anything)
	// or "llmd" (R llm-d-inference-sim engines configured as issue 19
	// measured the problem, llmdEngineArgs; fresh ones for every system).
	Engine string
	// Endpoints are the base URLs of your own OpenAI-compatible replicas
	// (vLLM, SGLang, TGI): R = len(Endpoints), time scale 1.
	Endpoints []string
	// Model is the "model" of every request; empty: the first id of the
	// first replica's /v1/models (with endpoints or transformers), none
	// with the sim.
	Model string
	// Replicas is R for sim, transformers and llmd (default 4; 1 for llmd
	// and for engine-calibration).
	Replicas int
	// Rates are the arrival rates in requests per second of engine time
	// (default 4; llmd: 20, 30; engine-calibration: 4, 8, 12).
	Rates []float64
	// Scale is the time scale: 1 s of engine time runs in Scale s.
	// Default 0.25 with the sim, 1 otherwise (real engines run in real time).
	Scale float64
	// SharedGPU, with the sim, puts the R engines on one simulated GPU
	// (sim.GPU) whose work they take turns on, as co-located replicas do;
	// its value is the share of a step's fixed cost that is GPU work (the
	// rest is each engine's own CPU time). 0: a GPU each.
	SharedGPU float64
	// StreamHeaders, with the sim, is when its engines send a stream's
	// status and headers (sim.Config.StreamHeaders): "immediate" (the
	// default: at once, before the queue and the prefill, as vLLM's and
	// SGLang's servers do) or "first_token" (with the first token).
	StreamHeaders string
	// Prompts (P), PromptWords (W) and UniqueWords (U): P shared system
	// prompts of W words; each request is one of them + U words of its
	// own. One word = one token (3 letters + a space: 4 characters, as a
	// simulator counting 4 characters per token counts it). Defaults 4,
	// 1500, 40.
	Prompts, PromptWords, UniqueWords int
	// MaxTokens is every request's max_tokens (default 32; llmd: 16).
	MaxTokens int
	// Arrivals is how long arrivals last, in engine time (default 25 s;
	// 8 s with -quick); ClientTimeout bounds each request (default 40 s).
	Arrivals, ClientTimeout time.Duration
	// Python runs server.py (default python3); ServerArgs are extra flags
	// for it (e.g. --layers 2 --hidden 256 --device cpu) or, with llmd,
	// for llm-d-inference-sim after llmdEngineArgs (a repeated flag: the
	// last one wins).
	Python     string
	ServerArgs []string
	// Seed seeds the prompts and the arrival times (default 1). Every
	// repetition draws its own arrivals and requests (workloadSeed): all
	// systems of one repetition see the same ones, so they stay paired,
	// and the mean over repetitions is over workloads, not over replays
	// of one.
	Seed uint64
}

// resolve returns o with its defaults, or an error naming a bad field.
func (o EngineOptions) resolve(calibrate, quick bool) (EngineOptions, error) {
	for i, ep := range o.Endpoints {
		u, err := url.Parse(strings.TrimSpace(ep))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return o, fmt.Errorf("-endpoints: %q is not an http(s)://host:port URL", ep)
		}
		o.Endpoints[i] = u.Scheme + "://" + u.Host
	}
	switch {
	case len(o.Endpoints) > 0:
		if o.Engine != "" && o.Engine != "sim" {
			return o, fmt.Errorf("-endpoints and -engine %s exclude each other", o.Engine)
		}
		o.Engine = "endpoints"
		if calibrate {
			o.Endpoints = o.Endpoints[:1]
		}
		o.Replicas = len(o.Endpoints)
	case o.Engine == "":
		o.Engine = "sim"
	case o.Engine != "sim" && o.Engine != "transformers" && o.Engine != "llmd":
		return o, fmt.Errorf("-engine must be sim, transformers or llmd, got %q", o.Engine)
	}
	switch {
	case o.StreamHeaders != "" && o.Engine != "sim":
		return o, fmt.Errorf("-stream-headers is the sim's (-engine sim), not %s's", o.Engine)
	case o.StreamHeaders != "" && o.StreamHeaders != sim.StreamHeadersFirstToken && o.StreamHeaders != sim.StreamHeadersImmediate:
		return o, fmt.Errorf("-stream-headers must be %s or %s, got %q", sim.StreamHeadersFirstToken, sim.StreamHeadersImmediate, o.StreamHeaders)
	}
	if calibrate {
		o.Replicas = 1
	}
	if o.Replicas == 0 {
		o.Replicas = 4
		if o.Engine == "llmd" {
			o.Replicas = 1
		}
	}
	if len(o.Rates) == 0 {
		switch {
		case calibrate:
			o.Rates = []float64{4, 8, 12}
		case o.Engine == "llmd":
			o.Rates = []float64{20, 30}
		default:
			o.Rates = []float64{4}
		}
	}
	if o.Engine == "llmd" {
		if o.Model == "" {
			o.Model = "m" // startLLMDSims' --model
		}
		if o.MaxTokens == 0 {
			// Issue 19's regime: 20 req/s just under what the engine
			// serves with its batch full (16 ÷ (0.3 s + 15 × 30 ms) =
			// 21 req/s), 30 req/s 1.4× over it. With 32 tokens both rates
			// are past it (12.8 req/s): direct TTFT p50 7.5 s and 17.5 s.
			o.MaxTokens = 16
		}
	}
	if o.Scale == 0 {
		o.Scale = 1
		if o.Engine == "sim" {
			o.Scale = 0.25
		}
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Prompts, 4)
	def(&o.PromptWords, 1500)
	def(&o.UniqueWords, 40)
	def(&o.MaxTokens, 32)
	if o.Arrivals == 0 {
		o.Arrivals = 25 * time.Second
		if quick {
			o.Arrivals = 8 * time.Second
		}
	}
	if o.ClientTimeout == 0 {
		o.ClientTimeout = 40 * time.Second
	}
	if o.Python == "" {
		o.Python = "python3"
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	switch {
	case o.Replicas < 1 || o.Replicas > 64:
		return o, fmt.Errorf("-replicas must be between 1 and 64, got %d", o.Replicas)
	case !(o.Scale > 0 && o.Scale <= 100):
		return o, fmt.Errorf("-scale must be in (0, 100], got %v", o.Scale)
	case o.Prompts < 1 || o.PromptWords < 0 || o.UniqueWords < 1 || o.MaxTokens < 1:
		return o, fmt.Errorf("prompts %d, prompt words %d, unique words %d, max tokens %d: need ≥ 1 (prompt words ≥ 0)",
			o.Prompts, o.PromptWords, o.UniqueWords, o.MaxTokens)
	}
	for _, rate := range o.Rates {
		if !(rate > 0 && rate <= 10000) {
			return o, fmt.Errorf("rates must be in (0, 10000] req/s, got %v", rate)
		}
	}
	return o, nil
}

var realEngineScenario = scenario{
	name: "real-engine",
	title: "Real engine: 4 shared 1,500-token system prompts, 32 streamed tokens, Poisson arrivals, " +
		"every system with its defaults",
	about: "The workload measured on one H100 (../shared/real-engine/2026-11-24-h100-transformers.md): P shared system " +
		"prompts of W words + U unique words per request (1 word = 1 token), max_tokens M, streamed /v1/completions, " +
		"Poisson arrivals, a client timeout per request; the same prompts and arrival times for every system (each repetition draws its own), " +
		"except that each system's run opens every shared prompt with two words of its own (a replica that outlives a run, " +
		"yours or a transformers one, must not hold the next system's prompts in its prefix cache). " +
		"Replicas: simulated engines (-engine sim, time scaled), your own endpoints (-endpoints), the transformers " +
		"server bench/realengine/server.py (-engine transformers), or llm-d-inference-sim (-engine llmd). All figures are in engine time. ttft = time to the " +
		"first streamed token; itl = a request's time between two streamed tokens, (end to end − ttft) ÷ (tokens − 1): " +
		"the engine's step as a request sees it; p50/p90/p99 = end to end; out tok/s = output tokens counted from the SSE chunks ÷ wall " +
		"time from the first arrival to the last token received; prefix reuse = Δ prefix_cache_hits ÷ Δ prefix_cache_queries " +
		"over the replicas' /metrics (prompt tokens served from the prefix cache); per replica from X-Sim-Replica " +
		"(sim) or the replicas' Δ vllm:request_success_total (real engines); timeout = no answer within the client " +
		"timeout (an outcome of overload, not a harness failure).",
	extras: []extraCol{{"rate", "rate", "%g/s"}, {"ttft_p50_s", "ttft p50", "%.2f s"}, {"ttft_p90_s", "ttft p90", "%.2f s"},
		{"ttft_p99_s", "ttft p99", "%.2f s"}, {"itl_p50_s", "itl p50", "%.3f s"}, {"out_tok_s", "out tok/s", "%.0f"}, {"prefix_reuse", "prefix reuse", "%.2f"},
		{"batch", "batch", "%.1f"}, {"engine_queue", "engine queue", "%.1f"}, {"edge_held", "held at edge", "%.1f"}},
	run: func(r *runner) { realEngine(r, false) },
}

var engineCalibrationScenario = scenario{
	name:  "engine-calibration",
	title: "Engine calibration: direct to ONE replica at 4, 8 and 12 req/s, next to the measured H100 engine",
	about: "The real-engine workload sent straight to one replica (no proxy) at each rate; the appendix puts every " +
		"figure next to the real engine's (../shared/real-engine/2026-11-24-h100-transformers.md) with the ratio " +
		"replica/real. Figures in engine time. At a measured rate the replica gets as many requests as the measured run sent " +
		"(94, 206, 320: Poisson arrivals given their count), so both are compared at the same load.",
	extras: realEngineScenario.extras,
	run:    func(r *runner) { realEngine(r, true) },
}

// engineReplicaConfig is one simulated engine replica at time scale
// scale (1 s of engine time runs in scale s): the simulator's step-based
// engine calibrated against the measured one (sim.CalibratedEngine; its
// fit is in bench/results/engine-calibration.md).
func engineReplicaConfig(name string, scale float64) sim.Config {
	c := sim.CalibratedEngine(scale)
	c.Name = name
	return c
}

// engineWords is the fixed vocabulary of the prompts: 3-letter
// consonant-vowel-consonant words (1,620 of them).
func engineWords() []string {
	const cons, vows = "bcdfghjklmnprstvwz", "aeiou"
	var out []string
	for _, a := range cons {
		for _, b := range vows {
			for _, c := range cons {
				out = append(out, string([]rune{a, b, c}))
			}
		}
	}
	return out
}

// enginePrompts returns the P shared system prompts (each W words, every
// word followed by one space).
func enginePrompts(e EngineOptions) []string { return sharedPrompts(e.Seed, e.Prompts, e.PromptWords) }

// sharedPrompts returns n prompts of w words drawn from engineWords, each
// followed by one space, reproducible from seed.
func sharedPrompts(seed uint64, n, w int) []string {
	words := engineWords()
	out := make([]string, n)
	for p := range out {
		rng := rand.New(rand.NewPCG(seed, uint64(p)+1))
		var b strings.Builder
		for range w {
			b.WriteString(words[rng.IntN(len(words))] + " ")
		}
		out[p] = b.String()
	}
	return out
}

// promptRuns numbers the system runs of the real-engine scenario in this
// process, from a random start, so that no two runs, in this invocation
// or another against the same replicas, open their prompts alike.
var promptRuns = func() *atomic.Uint64 {
	var n atomic.Uint64
	n.Store(rand.Uint64())
	return &n
}()

// promptsOfARun returns the shared prompts as one system's run sends
// them: each opens with two words of the run's own in place of its first
// two. Replicas that outlive a run (your endpoints, the transformers
// replicas) keep its prompts in their prefix caches; sent the same ones,
// the next system found them cached on every replica (on all of them
// after round robin), and how it placed prompts showed only in its first
// requests. Every run pays for its own cold prompts, and the workload is
// otherwise the same: lengths, words and each request's prompt.
func promptsOfARun(prefixes []string) []string {
	openings := sharedPrompts(promptRuns.Add(1), len(prefixes), 2)
	out := make([]string, len(prefixes))
	for p, text := range prefixes {
		k := 4 * min(2, len(text)/4) // words of 3 letters and a space
		out[p] = openings[p][:k] + text[k:]
	}
	return out
}

// workloadSeed seeds the arrivals and requests of rate index ri in
// repetition rep (1-based); the first repetition's are those of every
// earlier run. One workload replayed rep after rep measured its timing
// jitter only: a system that one draw of arrivals and prefixes happened
// to suit (or not) read so in every repetition.
func workloadSeed(seed uint64, ri, rep int) uint64 {
	return seed*1000 + uint64(ri) + 1 + 1_000_003*uint64(max(rep, 1)-1)
}

// engineBody is one request: its prefix id and JSON body.
type engineBody struct {
	prefix int
	json   string
}

func engineBodies(e EngineOptions, prefixes []string, n int, seed uint64) []engineBody {
	words := engineWords()
	rng := rand.New(rand.NewPCG(seed, 0xb0d1e5))
	out := make([]engineBody, n)
	for i := range out {
		id := rng.IntN(len(prefixes))
		var b strings.Builder
		b.WriteString(prefixes[id])
		for range e.UniqueWords {
			b.WriteString(words[rng.IntN(len(words))] + " ")
		}
		req := map[string]any{"prompt": b.String(), "max_tokens": e.MaxTokens, "stream": true,
			// Every request generates max_tokens tokens (vLLM, SGLang).
			"ignore_eos": true, "temperature": 0}
		if e.Model != "" {
			req["model"] = e.Model
		}
		j, _ := json.Marshal(req)
		out[i] = engineBody{id, string(j)}
	}
	return out
}

func realEngine(r *runner, calibrate bool) {
	e, err := r.opt.Engine.resolve(calibrate, r.opt.Quick)
	if err != nil {
		r.res.Failures = append(r.res.Failures, err.Error())
		return
	}
	if r.rep == 1 {
		if !calibrate {
			r.res.suffix = fmt.Sprintf("-%s-r%d", e.Engine, e.Replicas)
		} else if e.Engine != "sim" {
			r.res.suffix = "-" + e.Engine
		}
		r.res.About = fmt.Sprintf("%s Here: %s, R = %d, scale %g, P = %d, W = %d, U = %d, M = %d, %v of arrivals, "+
			"client timeout %v, rates %v req/s.", r.res.About, e.Engine, e.Replicas, e.Scale, e.Prompts, e.PromptWords,
			e.UniqueWords, e.MaxTokens, e.Arrivals, e.ClientTimeout, e.Rates)
		if !calibrate {
			r.res.Title = fmt.Sprintf("Real engine (%s, R = %d): %d shared %s-token system prompts, %d streamed tokens, "+
				"Poisson arrivals, every system with its defaults", e.Engine, e.Replicas, e.Prompts, thousands(e.PromptWords), e.MaxTokens)
		}
		if e.Engine == "sim" && e.SharedGPU > 0 {
			r.res.suffix += "-gpu"
			r.res.About += fmt.Sprintf(" The %d engines share ONE simulated GPU (-shared-gpu %g): their steps' GPU work "+
				"(%g of the fixed step cost and all the per-token cost) takes turns on it, the rest of each step runs in parallel.",
				e.Replicas, e.SharedGPU, e.SharedGPU)
		}
		if e.Engine == "sim" && e.StreamHeaders == sim.StreamHeadersFirstToken {
			r.res.suffix += "-headers-first-token"
			r.res.About += " The simulated engines send a stream's status and headers with its first token " +
				"(-stream-headers first_token), not as soon as the request is accepted as vLLM's and SGLang's servers do: " +
				"a proxy's first byte then carries the engine's queue and prefill."
		} else if e.Engine == "sim" {
			r.res.About += " The simulated engines send a stream's status and headers as soon as the request is accepted, " +
				"before it queues or prefills, as vLLM's and SGLang's servers do (-stream-headers immediate, the default): " +
				"a proxy's first byte is then no load signal."
		}
		if e.Engine == "llmd" {
			r.res.About += fmt.Sprintf(" Each replica: llm-d-inference-sim v0.10.2 (fresh for every system) with %s "+
				"(time factor 1 + 2(n−1)/15 with n running: 3 with the batch full, on the first token and every next one; "+
				"no KV cache, so no prefix reuse). batch, engine queue = the replicas' vllm:num_requests_running and "+
				"_waiting, mean over the arrivals (sampled every 250 ms); held at edge = the client's requests in flight "+
				"less both (queued in the proxy).", strings.Join(llmdArgs(e), " "))
		}
	}
	switch {
	case e.Engine == "endpoints":
		r.engines = e.Endpoints
	case e.Engine == "transformers" && r.engines == nil:
		if r.engines, err = r.startEngineServers(e); err != nil {
			r.res.Failures = append(r.res.Failures, "starting the transformers replicas: "+err.Error())
			return
		}
	}
	var llmdBin string
	if e.Engine == "llmd" {
		if llmdBin, err = LLMDSimBinary(r.ctx); err != nil {
			r.res.Failures = append(r.res.Failures, "-engine llmd: "+err.Error())
			return
		}
	}
	if e.Model == "" && len(r.engines) > 0 {
		if e.Model, err = firstModel(r.ctx, r.engines[0]); err != nil {
			r.res.Failures = append(r.res.Failures, err.Error())
			return
		}
	}
	var fleet []sim.Config
	if e.Engine == "sim" {
		var gpu *sim.GPU
		if e.SharedGPU > 0 {
			gpu = sim.NewGPU(e.SharedGPU)
		}
		for i := range e.Replicas {
			c := engineReplicaConfig(fmt.Sprintf("engine-%d", i), e.Scale)
			c.GPU = gpu
			c.StreamHeaders = e.StreamHeaders
			fleet = append(fleet, c)
		}
	}
	// live are the llm-d-inference-sim engines of the system running now
	// (fresh ones for every system: no request of the previous one left).
	var live []string
	replicaURLs := func(f []*sim.Server) []string {
		switch {
		case e.Engine == "llmd":
			return live
		case len(r.engines) > 0:
			return r.engines
		}
		return urls(f)
	}
	prefixes := enginePrompts(e)
	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * e.Scale) }
	rates := e.Rates
	if r.opt.Quick {
		rates = rates[:1]
	}
	for ri, rate := range rates {
		seed := workloadSeed(e.Seed, ri, r.rep)
		arrivals := poisson(rate/e.Scale, scaled(e.Arrivals), seed)
		if real := measuredAt(rate); calibrate && real != nil && e.Arrivals == 25*time.Second {
			// As many requests as the measured run sent (Poisson given its
			// count), so the two are compared at the same load.
			arrivals = poissonGiven(real.sent, scaled(e.Arrivals), seed)
		}
		var bodies []engineBody
		var before []map[string]float64
		var occ *occupancy
		var idleNote string
		load := func(f []*sim.Server, proxies []string) workload {
			bodies = engineBodies(e, promptsOfARun(prefixes), len(arrivals), seed)
			idleNote = ""
			if len(r.engines) > 0 { // they outlive the runs: the last one's work may go on
				var waited time.Duration
				var busy string
				before, waited, busy = replicasIdle(r.ctx, r.engines, idleLimit)
				switch {
				case busy != "":
					idleNote = fmt.Sprintf("started on replicas still busy after %v (%s)", waited.Round(time.Second), busy)
				case waited >= time.Second:
					idleNote = fmt.Sprintf("started once the replicas were idle, %.1f s after the run before", waited.Seconds())
				}
			} else {
				before = scrapeReplicas(r.ctx, replicaURLs(f))
			}
			w := workload{arrivals: arrivals, sse: true, build: func(n int) (*http.Request, int) {
				p := n % len(proxies)
				req, _ := http.NewRequest(http.MethodPost, proxies[p]+"/v1/completions", strings.NewReader(bodies[n].json))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Prefix-Id", strconv.Itoa(bodies[n].prefix))
				return req, p
			}}
			if e.Engine != "sim" {
				// Real engines: sample their running and waiting gauges (the
				// simulated ones keep their CPU for the run).
				occ = &occupancy{}
				w.monitor = occ.sampler(replicaURLs(f), 250*time.Millisecond)
			}
			return w
		}
		after := func(f []*sim.Server, recs []Record, s *Summary) {
			if idleNote != "" {
				s.Notes = append(s.Notes, idleNote)
			}
			now := scrapeReplicas(r.ctx, replicaURLs(f))
			if e.Engine != "sim" {
				now = settledCounts(r.ctx, replicaURLs(f), before, now, recs)
			}
			engineMeasures(rate, e.ClientTimeout, replicaURLs(f), before, now, recs, s)
			if occ != nil {
				occ.measure(recs, e.Arrivals, e.Scale, s)
			}
		}
		sys := oneProxy{r: r, base: sysSpec{fleet: fleet, load: load, after: after,
			reqTimeout: scaled(e.ClientTimeout), timeScale: e.Scale}}
		if len(r.engines) > 0 || e.Engine == "llmd" {
			sys.upstreams = func([]*sim.Server) []string { return replicaURLs(nil) }
		}
		at := "@" + strconv.FormatFloat(rate, 'g', -1, 64) + "rps"
		direct := sys.base
		direct.name, direct.desc = "direct"+at, "no proxy: the client sends straight to the one replica"
		direct.start = func(f []*sim.Server) ([]string, error) { return replicaURLs(f), nil }
		var systems []sysSpec
		if e.Replicas == 1 {
			systems = append(systems, direct)
		}
		if !calibrate {
			pool := fmt.Sprintf("re%d", ri)
			systems = append(systems,
				sys.caddy("caddy_round_robin"+at, "Caddy lb_policy round_robin", "lb_policy round_robin"),
				sys.caddy("caddy_least_conn"+at, "Caddy lb_policy least_conn", "lb_policy least_conn"),
				sys.caddy("oracle_header_hash"+at, "oracle: Caddy lb_policy header X-Prefix-Id (hashes the prefix id, which only it sees)",
					"lb_policy header X-Prefix-Id"),
				sys.caddy("sluice_queued_least_latency"+at, "Sluice queued_least_latency, defaults", "lb_policy queued_least_latency"),
				// As the quick start runs it: behind custom_router, which
				// sees a stream's first token where the engine sends the
				// headers at once (vLLM, SGLang, the default sim).
				sys.behindCustomRouter("sluice_queued_least_latency_custom_router"+at,
					"Sluice queued_least_latency, defaults, behind custom_router (learns from a stream's first token)",
					pool+"cr", fmt.Sprintf("lb_policy queued_least_latency {\n\tpool %scr\n}", pool)),
				sys.caddy("sluice_load_aware"+at, "Sluice load_aware, defaults", "lb_policy load_aware"),
				sys.caddy("sluice_cache_aware"+at, "Sluice cache_aware, defaults", "lb_policy cache_aware"),
				sys.globalRedisLeast("sluice_global_redis_least"+at, "Sluice global_redis_least, defaults (one private Redis)",
					pool, fmt.Sprintf("bench-re-%d", time.Now().UnixNano()%1e9)),
			)
			fc := sys.caddy("sluice_flow_control"+at, "Sluice flow_control, defaults (concurrency detector) + reverse_proxy lb_policy least_conn", "")
			fc.start = func(f []*sim.Server) ([]string, error) {
				return r.caddyProxies(fc.name, 1, func(int) string {
					return "flow_control\n" + staticProxy(sys.ups(f), "lb_policy least_conn")
				})
			}
			systems = append(systems, fc)
			if r.res.Reps > 1 {
				// Round robin again, last in every rep: what the method
				// itself moves between two runs of one system (a policy
				// within that of round robin is not told apart from it).
				systems = append(systems, sys.caddy("caddy_round_robin_again"+at,
					"Caddy lb_policy round_robin again, last in every rep: the method's own error (should read as round robin)",
					"lb_policy round_robin"))
			}
		}
		for _, s := range systems {
			if e.Engine == "llmd" {
				// Fresh engines first, then the system's own start.
				start := s.start
				s.start = func(f []*sim.Server) ([]string, error) {
					ports, err := freePorts(e.Replicas)
					if err != nil {
						return nil, err
					}
					if live, err = r.startLLMDSims(llmdBin, ports, func(int) []string { return llmdArgs(e) }); err != nil {
						return nil, err
					}
					return start(f)
				}
			}
			r.system(s)
		}
	}
	switch {
	case calibrate:
		r.res.appendix = calibrationTable(r.res.Systems, r.rep)
	case e.Replicas == 1 && r.rep == r.res.Reps:
		r.res.appendix = directRatios(r.res.Systems)
	case r.res.Reps > 1 && r.rep == r.res.Reps:
		r.res.appendix = pairedRatios(r.res.Systems)
	}
}

// llmdEngineArgs configure each -engine llmd replica as issue 19 measured
// the problem: a batching engine that slows as its batch fills — 16
// sequences at once, each step up to 3× slower with the batch full
// (llm-d-inference-sim's time factor grows linearly from 1 with one
// sequence running to 3 with 16; the rest wait in the engine's queue), a
// 100 ms time to first token (the default calculator's constant one:
// prompt length does not matter) and 10 ms between tokens, both × the
// factor at the time.
var llmdEngineArgs = []string{"--max-num-seqs", "16", "--time-factor-under-load", "3",
	"--time-to-first-token", "100ms", "--inter-token-latency", "10ms"}

// llmdArgs are the flags of one -engine llmd replica: llmdEngineArgs, a
// context window that holds the workload's requests (the dummy tokenizer:
// one token per word), then -server-args.
func llmdArgs(e EngineOptions) []string {
	window := max(4096, 2*(e.PromptWords+e.UniqueWords+e.MaxTokens))
	return slices.Concat(llmdEngineArgs, []string{"--max-model-len", strconv.Itoa(window)}, e.ServerArgs)
}

// engineMeasures adds the scenario's figures to s: the rate, TTFT
// percentiles, output tokens/s, prefix reuse and per-replica counts from
// the replicas' metrics (before/after the run), and moves the requests
// the client timed out from lost to errors ("timeout").
func engineMeasures(rate float64, timeout time.Duration, replicas []string, before, after []map[string]float64, recs []Record, s *Summary) {
	s.Extra["rate"] = rate
	var ttft, itl []time.Duration
	// Output tokens/s is over the time they took to come: from the first
	// arrival to the last token (not to a request the client gave up on).
	var first, last time.Duration = -1, 0
	tokens, timeouts, headerCounted := 0, 0, 0
	for _, rec := range recs {
		if first < 0 || rec.Start < first {
			first = rec.Start
		}
		if rec.Tokens > 0 {
			last = max(last, rec.Start+rec.LastToken)
		}
		tokens += rec.Tokens
		if rec.Status == 200 && rec.Err == "" {
			ttft = append(ttft, rec.TTFT)
			if rec.Tokens > 1 && rec.Latency > rec.TTFT {
				itl = append(itl, (rec.Latency-rec.TTFT)/time.Duration(rec.Tokens-1))
			}
			if rec.Replica != "" {
				headerCounted++
			}
		}
		if rec.Lost() && (strings.Contains(rec.Err, "Client.Timeout") || strings.Contains(rec.Err, "deadline exceeded")) {
			timeouts++
		}
	}
	if timeouts > 0 {
		s.Lost -= timeouts
		s.Errors["timeout"] = timeouts
		s.Notes = append(s.Notes, fmt.Sprintf("%d requests got no answer within the client timeout (%v)", timeouts, timeout))
	}
	slices.Sort(ttft)
	if len(ttft) > 0 {
		s.Extra["ttft_p50_s"], s.Extra["ttft_p90_s"], s.Extra["ttft_p99_s"] = quantile(ttft, 0.5), quantile(ttft, 0.9), quantile(ttft, 0.99)
	}
	if len(itl) > 0 {
		slices.Sort(itl)
		s.Extra["itl_p50_s"] = quantile(itl, 0.5)
	}
	if wall := last - max(first, 0); wall > 0 {
		s.Extra["out_tok_s"] = float64(tokens) / wall.Seconds()
	}
	var q, h float64
	var served []float64
	complete := len(before) == len(replicas) && len(after) == len(replicas)
	for i := range replicas {
		if !complete || before[i] == nil || after[i] == nil {
			complete = false
			break
		}
		q += counter(after[i], prefixQueryNames) - counter(before[i], prefixQueryNames)
		h += counter(after[i], prefixHitNames) - counter(before[i], prefixHitNames)
		served = append(served, counter(after[i], []string{"vllm:request_success_total"})-counter(before[i], []string{"vllm:request_success_total"}))
	}
	if !complete {
		s.Notes = append(s.Notes, "some replica's /metrics could not be read: no prefix reuse, per-replica counts from headers only")
	}
	if complete && q > 0 {
		s.Extra["prefix_reuse"] = h / q
	}
	// Per replica: the sim's X-Sim-Replica header; a real engine's own
	// count of requests served.
	if headerCounted == 0 && complete && len(ttft) > 0 {
		s.PerReplica = map[string]int{}
		for i, u := range replicas {
			s.PerReplica[strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://")] = int(served[i])
		}
		s.ReplicaMin, s.ReplicaMax = -1, 0
		for _, n := range s.PerReplica {
			if s.ReplicaMin < 0 || n < s.ReplicaMin {
				s.ReplicaMin = n
			}
			s.ReplicaMax = max(s.ReplicaMax, n)
		}
	}
	var parts []string
	for _, k := range sortedKeys(s.PerReplica) {
		parts = append(parts, fmt.Sprintf("%s %d", k, s.PerReplica[k]))
	}
	s.Notes = append(s.Notes, "per replica: "+strings.Join(parts, ", "))
}

var (
	prefixQueryNames = []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total"}
	prefixHitNames   = []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total"}
)

// counter returns the first of names present in m (0 if none).
func counter(m map[string]float64, names []string) float64 {
	for _, n := range names {
		if v, ok := m[n]; ok {
			return v
		}
	}
	return 0
}

// scrapeReplicas reads every replica's /metrics (nil for one that fails).
func scrapeReplicas(ctx context.Context, replicas []string) []map[string]float64 {
	out := make([]map[string]float64, len(replicas))
	for i, u := range replicas {
		m, err := scrapeMetrics(ctx, u+"/metrics")
		if err == nil {
			out[i] = m
		}
	}
	return out
}

// scrapeMetrics reads a Prometheus text page: each metric's samples summed
// over their label sets, by name.
func scrapeMetrics(ctx context.Context, u string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d", u, resp.StatusCode)
	}
	return parseMetrics(io.LimitReader(resp.Body, 16<<20))
}

func parseMetrics(rd io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			j := strings.LastIndexByte(rest, '}')
			if j < 0 {
				continue
			}
			rest = rest[j+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	return out, sc.Err()
}

// firstModel returns the first model id a replica's /v1/models lists.
func firstModel(ctx context.Context, base string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("reading the model name from %s/v1/models (or pass -model): %w", base, err)
	}
	defer resp.Body.Close()
	var m struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&m); err != nil || len(m.Data) == 0 {
		return "", fmt.Errorf("%s/v1/models lists no model (pass -model): %v", base, err)
	}
	return m.Data[0].ID, nil
}

// startEngineServers starts R copies of bench/realengine/server.py on
// free loopback ports (infra processes: they serve every system and are
// stopped by PID at the end) and waits until each answers /health.
func (r *runner) startEngineServers(e EngineOptions) ([]string, error) {
	script, err := serverScript()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(e.Replicas)
	if err != nil {
		return nil, err
	}
	var out []string
	var started []*proc
	for i, port := range ports {
		args := append([]string{script, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
			"--name", fmt.Sprintf("engine-%d", i)}, e.ServerArgs...)
		p, err := r.infra.start(fmt.Sprintf("engine-%d", i), nil, e.Python, args...)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(r.log, "engine-%d: pid %d, %s %s\n", i, p.cmd.Process.Pid, e.Python, strings.Join(args, " "))
		started = append(started, p)
		out = append(out, fmt.Sprintf("http://127.0.0.1:%d", port))
	}
	// Model building and warm-up take minutes on a GPU; bounded by the run.
	for i, p := range started {
		if err := waitHealthy(r.ctx, p, out[i], 20*time.Minute); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// serverScript finds bench/realengine/server.py from the working
// directory (repository root or bench/) or next to this source file.
func serverScript() (string, error) {
	cands := []string{filepath.Join("bench", "realengine", "server.py"), filepath.Join("realengine", "server.py")}
	if _, file, _, ok := runtime.Caller(0); ok {
		cands = append(cands, filepath.Join(filepath.Dir(file), "realengine", "server.py"))
	}
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return filepath.Abs(c)
		}
	}
	return "", errors.New("bench/realengine/server.py not found (run from the repository root)")
}

// waitHealthy polls base/health until it answers 200, the process exits,
// or timeout.
func waitHealthy(ctx context.Context, p *proc, base string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was healthy (%v)\n%s", p.name, p.waitErr, tail(p.logPath))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s/health not 200 after %v\n%s", p.name, base, timeout, tail(p.logPath))
		}
	}
}

// realFigure is one row of the measured engine's table.
type realFigure struct {
	rate                      float64
	ttftP50, ttftP90, ttftP99 float64 // s
	e2eP50, e2eP90            float64 // s
	outTokS                   float64
	answered, sent            int
	prefixReuse               float64
}

// measuredH100 is the table "Sent straight to one replica" of
// ../shared/real-engine/2026-11-24-h100-transformers.md (relative to the
// repository root): transformers 5.17 continuous batching on one H100.
var measuredH100 = []realFigure{
	{4, 0.49, 1.65, 2.35, 4.79, 6.11, 94, 94, 94, 0.87},
	{8, 4.80, 9.60, 12.6, 8.41, 13.7, 147, 206, 206, 0.89},
	{12, 19.7, 33.6, 36.5, 23.3, 36.6, 156, 308, 320, 0.90},
}

// measuredAt is the measured engine's row at rate, nil if none.
func measuredAt(rate float64) *realFigure {
	for i := range measuredH100 {
		if measuredH100[i].rate == rate {
			return &measuredH100[i]
		}
	}
	return nil
}

// calibrationTable sets the direct runs of rep next to measuredH100.
func calibrationTable(systems []Summary, rep int) string {
	var b strings.Builder
	b.WriteString("Next to the measured engine (`../shared/real-engine/2026-11-24-h100-transformers.md`), " +
		"direct to one replica; ratio = this replica ÷ the real one (1.00 = calibrated):\n\n")
	head := []string{"rate", "figure", "here", "real H100", "ratio"}
	var rows [][]string
	ratio := func(a, b float64) string {
		if b == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	ss := slices.Clone(systems)
	sort.SliceStable(ss, func(i, j int) bool { return ss[i].Extra["rate"] < ss[j].Extra["rate"] })
	for _, s := range ss {
		if s.Rep != rep && !(rep <= 1 && s.Rep == 0) {
			continue
		}
		rate := s.Extra["rate"]
		var real *realFigure
		for i := range measuredH100 {
			if measuredH100[i].rate == rate {
				real = &measuredH100[i]
			}
		}
		if real == nil {
			continue
		}
		label := fmt.Sprintf("%g req/s", rate)
		add := func(fig string, here, want float64, format string) {
			rows = append(rows, []string{label, fig, fmt.Sprintf(format, here), fmt.Sprintf(format, want), ratio(here, want)})
		}
		add("TTFT p50", s.Extra["ttft_p50_s"], real.ttftP50, "%.2f s")
		add("TTFT p90", s.Extra["ttft_p90_s"], real.ttftP90, "%.2f s")
		add("TTFT p99", s.Extra["ttft_p99_s"], real.ttftP99, "%.2f s")
		add("end-to-end p50", s.P50, real.e2eP50, "%.2f s")
		add("end-to-end p90", s.P90, real.e2eP90, "%.2f s")
		add("output tokens/s", s.Extra["out_tok_s"], real.outTokS, "%.0f")
		add("answered", float64(s.OK)/float64(max(s.Requests, 1)), float64(real.answered)/float64(real.sent), "%.2f")
		if v, ok := s.Extra["prefix_reuse"]; ok {
			add("prefix reuse", v, real.prefixReuse, "%.2f")
		}
	}
	if len(rows) == 0 {
		return ""
	}
	var md strings.Builder
	mdTable(&md, head, rows)
	b.WriteString(md.String())
	return b.String()
}

// replicasIdle waits until no replica runs or holds a request (its
// vllm:num_requests_running and _waiting at 0), at most limit, and
// returns the last scrape (the run's "before"), how long it waited and,
// past limit, what was still there. Replicas that outlive a system's run
// may still work on its requests whose clients left (a server may notice
// a client gone only when it writes the request's next token): the next
// system must not start on that work. Replicas without both gauges are
// not waited for; replicas that also serve other traffic wait the whole
// limit, which the system's notes then say.
func replicasIdle(ctx context.Context, replicas []string, limit time.Duration) (last []map[string]float64, waited time.Duration, busy string) {
	start := time.Now()
	for {
		last = scrapeReplicas(ctx, replicas)
		var held []string
		for i, m := range last {
			run, okR := m[runningGauge]
			wait, okW := m[waitingGauge]
			if okR && okW && run+wait > 0 {
				held = append(held, fmt.Sprintf("%s: %g running, %g waiting", replicas[i], run, wait))
			}
		}
		waited, busy = time.Since(start), strings.Join(held, "; ")
		if busy == "" || waited >= limit || ctx.Err() != nil {
			return last, waited, busy
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// idleLimit bounds replicasIdle's wait before a system's run.
const idleLimit = time.Minute

// occupancy samples the replicas' own gauges during a run —
// vllm:num_requests_running (the batch) and vllm:num_requests_waiting
// (the engine's queue), summed over the replicas — to set them against
// the requests the client has in flight: the difference is what the
// system holds at its edge (queued in the proxy, not yet sent).
type occupancy struct {
	mu      sync.Mutex
	samples []occSample
	missing string // why a sample was dropped, the first time
}

type occSample struct {
	at               time.Duration // since the run's start, wall time
	running, waiting float64
}

const (
	runningGauge = "vllm:num_requests_running"
	waitingGauge = "vllm:num_requests_waiting"
)

// sampler is a workload monitor: it scrapes every replica's /metrics
// every period until the run ends.
func (o *occupancy) sampler(replicas []string, every time.Duration) func(ctx context.Context) {
	return func(ctx context.Context) {
		t0 := time.Now()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			at := time.Since(t0)
			smp, why := occSample{at: at}, ""
			for _, u := range replicas {
				m, err := scrapeMetrics(ctx, u+"/metrics")
				if err != nil {
					why = err.Error()
					break
				}
				run, okR := m[runningGauge]
				wait, okW := m[waitingGauge]
				if !okR || !okW {
					why = fmt.Sprintf("%s/metrics has no %s or %s", u, runningGauge, waitingGauge)
					break
				}
				smp.running += run
				smp.waiting += wait
			}
			o.mu.Lock()
			if why == "" {
				o.samples = append(o.samples, smp)
			} else if o.missing == "" && ctx.Err() == nil {
				o.missing = why
			}
			o.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}
}

// measure adds the means over the arrival window (engine time; scale
// converts the samples' wall time) to s: batch (running), engine queue
// (waiting) and held at the edge (the client's requests in flight less
// running and waiting, at least 0), with their peaks in a note.
func (o *occupancy) measure(recs []Record, window time.Duration, scale float64, s *Summary) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var n, run, wait, held, maxRun, maxWait, maxHeld float64
	for _, smp := range o.samples {
		at := time.Duration(float64(smp.at) / scale)
		if at > window {
			break
		}
		inflight := 0
		for _, rec := range recs {
			if rec.Start <= at && at < rec.Start+rec.Latency {
				inflight++
			}
		}
		h := max(0, float64(inflight)-smp.running-smp.waiting)
		n++
		run, wait, held = run+smp.running, wait+smp.waiting, held+h
		maxRun, maxWait, maxHeld = max(maxRun, smp.running), max(maxWait, smp.waiting), max(maxHeld, h)
	}
	if n == 0 {
		s.Notes = append(s.Notes, "no occupancy samples from the replicas' /metrics: "+o.missing)
		return
	}
	s.Extra["batch"], s.Extra["engine_queue"], s.Extra["edge_held"] = run/n, wait/n, held/n
	s.Notes = append(s.Notes, fmt.Sprintf("over the arrivals (%.0f samples of the replicas' gauges): running mean %.1f max %.0f, "+
		"waiting in the engine mean %.1f max %.0f, held at the edge (client in flight − running − waiting) mean %.1f max %.0f",
		n, run/n, maxRun, wait/n, maxWait, held/n, maxHeld))
}

// settledCounts returns the replicas' metrics once their
// vllm:request_success_total has counted every answer (an engine may
// count a request a moment after its last byte: llm-d-inference-sim
// does it through a channel), waiting at most 3 s; now is the first
// scrape after the run.
func settledCounts(ctx context.Context, replicas []string, before, now []map[string]float64, recs []Record) []map[string]float64 {
	answered := 0
	for _, rec := range recs {
		if rec.Status == 200 && rec.Err == "" {
			answered++
		}
	}
	success := []string{"vllm:request_success_total"}
	deadline := time.Now().Add(3 * time.Second)
	for {
		if len(before) != len(replicas) || len(now) != len(replicas) || answered == 0 {
			return now
		}
		sum, has := 0.0, false
		for i := range replicas {
			if before[i] == nil || now[i] == nil {
				return now
			}
			_, ok := now[i][success[0]]
			has = has || ok
			sum += counter(now[i], success) - counter(before[i], success)
		}
		if !has || sum >= float64(answered) || time.Now().After(deadline) || ctx.Err() != nil {
			return now
		}
		time.Sleep(100 * time.Millisecond)
		now = scrapeReplicas(ctx, replicas)
	}
}

// Issue 19's must-show, against direct to the one replica: every Sluice
// policy's TTFT p50 within ratioTTFT× direct's and its output tokens/s at
// least ratioTokens× direct's, at each rate.
const (
	ratioTTFT   = 1.25
	ratioTokens = 0.95
)

// directRatios is the appendix of an R = 1 run: per rep and rate, every
// system's TTFT p50 and output tokens/s ÷ direct's, pass or fail against
// ratioTTFT and ratioTokens, and how many Sluice rows pass.
func directRatios(systems []Summary) string {
	direct := runsOf(systems, "direct")
	ratio := func(a, b float64) (float64, string) {
		if b == 0 {
			return 0, "—"
		}
		return a / b, fmt.Sprintf("%.2f×", a/b)
	}
	var rows [][]string
	var sluice, sluicePass int
	var failed []string
	for _, s := range systems {
		d, ok := direct[runOf(s)]
		if !ok || strings.HasPrefix(s.System, "direct@") {
			continue
		}
		tr, trS := ratio(s.Extra["ttft_p50_s"], d.Extra["ttft_p50_s"])
		kr, krS := ratio(s.Extra["out_tok_s"], d.Extra["out_tok_s"])
		var why []string
		if trS == "—" || tr > ratioTTFT {
			why = append(why, "ttft")
		}
		if krS == "—" || kr < ratioTokens {
			why = append(why, "tok/s")
		}
		verdict := "pass"
		if len(why) > 0 {
			verdict = "**FAIL** (" + strings.Join(why, ", ") + ")"
		}
		if strings.HasPrefix(s.System, "sluice_") {
			sluice++
			if len(why) == 0 {
				sluicePass++
			} else {
				failed = append(failed, fmt.Sprintf("%s #%d", s.System, max(s.Rep, 1)))
			}
		}
		rows = append(rows, []string{fmt.Sprintf("%g/s", s.Extra["rate"]), strconv.Itoa(max(s.Rep, 1)), strings.Split(s.System, "@")[0],
			fmt.Sprintf("%d/%d", s.OK, s.Requests), fmt.Sprintf("%.2f s", s.Extra["ttft_p50_s"]), trS,
			fmt.Sprintf("%.0f", s.Extra["out_tok_s"]), krS, verdict})
	}
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Against direct to the one replica (same rate and rep): TTFT p50 ÷ direct's (pass: ≤ %.2f×) and output "+
		"tokens/s ÷ direct's (pass: ≥ %.2f×); ok = answered of sent (a request the client timed out has no TTFT: "+
		"compare the ok counts too).\n\n", ratioTTFT, ratioTokens)
	var dk []repRate
	for k := range direct {
		dk = append(dk, k)
	}
	sort.Slice(dk, func(i, j int) bool {
		if dk[i].rep != dk[j].rep {
			return dk[i].rep < dk[j].rep
		}
		return dk[i].rate < dk[j].rate
	})
	var dl []string
	for _, k := range dk {
		d := direct[k]
		dl = append(dl, fmt.Sprintf("%g/s #%d: TTFT p50 %.2f s, %.0f tok/s, ok %d/%d", k.rate, max(k.rep, 1),
			d.Extra["ttft_p50_s"], d.Extra["out_tok_s"], d.OK, d.Requests))
	}
	b.WriteString("Direct: " + strings.Join(dl, "; ") + ".\n\n")
	mdTable(&b, []string{"rate", "rep", "system", "ok", "ttft p50", "÷ direct", "out tok/s", "÷ direct", "verdict"}, rows)
	fmt.Fprintf(&b, "\nSluice policies within both bounds: %d of %d rows", sluicePass, sluice)
	if len(failed) > 0 {
		b.WriteString("; failing: " + strings.Join(failed, ", "))
	}
	b.WriteString(".\n")
	return b.String()
}

// thousands writes n with a comma between thousands (1,500).
func thousands(n int) string {
	d := strconv.Itoa(n)
	for i := len(d) - 3; i > 0 && d[i-1] != '-'; i -= 3 {
		d = d[:i] + "," + d[i:]
	}
	return d
}
