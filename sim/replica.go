package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Response headers set by the simulator.
const (
	// HeaderReplica carries the replica's configured name on every response.
	HeaderReplica = "X-Sim-Replica"
	// HeaderSeq carries, on responses that got a serving slot, the 1-based
	// order in which the replica granted slots. With a strict FIFO queue it
	// follows the arrival order (a waiter that gave up may leave a gap).
	// On a stream whose headers went out before it got the slot
	// (Config.StreamHeaders immediate, the default) it is an HTTP trailer,
	// declared in the Trailer header: read it from http.Response.Trailer
	// once the body has been read to EOF. See setMeta.
	HeaderSeq = "X-Sim-Seq"
	// HeaderCachedTokens carries, when the prefix cache is on (always with
	// the engine), the number of the request's prompt tokens found in the
	// cache (on responses that got a serving slot). A trailer on streams
	// whose headers went out early, as HeaderSeq.
	HeaderCachedTokens = "X-Sim-Cached-Tokens"
)

// The values of Config.StreamHeaders ("" is StreamHeadersImmediate).
const (
	StreamHeadersFirstToken = "first_token"
	StreamHeadersImmediate  = "immediate"
)

// statusClientGone is the status recorded (never sent) for requests whose
// client went away before the response was complete.
const statusClientGone = 499

// Replica is one simulated model replica. It is an http.Handler; create it
// with New. All methods are safe for concurrent use.
type Replica struct {
	cfg   Config
	q     *slotQueue
	cache *prefixCache  // nil unless cfg.PrefixCache is enabled
	pl    *prefillLine  // nil unless cfg.PrefillBlocksDecode
	eng   *engine       // nil unless cfg.Latency.Kind is LatencyEngine
	done  chan struct{} // closed by Close

	rngMu sync.Mutex
	rng   *rand.Rand

	faultMu      sync.Mutex
	faults       Faults
	stallRelease chan struct{} // closed (and replaced) when stalls are cleared

	requests, served, errs, stalls, cancelled, rejected atomic.Uint64
	promptTokens, completionTokens                      atomic.Uint64

	statusMu sync.Mutex
	byStatus map[int]uint64

	lifeMu   sync.Mutex
	closed   bool
	inflight int
	drained  chan struct{} // closed once closed && inflight == 0
}

// New validates cfg, applies the defaults and returns a ready replica.
func New(cfg Config) (*Replica, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64() | 1
	}
	var cache *prefixCache
	if cfg.PrefixCache.Enabled() {
		cache = newPrefixCache(cfg.PrefixCache.Blocks, cfg.PrefixCache.BlockChars)
	}
	var pl *prefillLine
	if cfg.PrefillBlocksDecode {
		pl = newPrefillLine()
	}
	done := make(chan struct{})
	var eng *engine
	if cfg.Latency.Kind == LatencyEngine {
		eng = newEngine(cfg, done)
	}
	return &Replica{
		cfg:          cfg,
		cache:        cache,
		pl:           pl,
		eng:          eng,
		q:            newSlotQueue(cfg.Concurrency, cfg.KVCapacityTokens),
		done:         done,
		rng:          rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		faults:       cfg.Faults,
		stallRelease: make(chan struct{}),
		byStatus:     make(map[int]uint64),
		drained:      make(chan struct{}),
	}, nil
}

// Name returns the replica's configured name.
func (rp *Replica) Name() string { return rp.cfg.Name }

// Config returns the replica's configuration with defaults applied. Its
// Faults field holds the initial faults; see Faults for the current ones.
func (rp *Replica) Config() Config { return rp.cfg }

// Faults returns the faults currently in effect.
func (rp *Replica) Faults() Faults {
	rp.faultMu.Lock()
	defer rp.faultMu.Unlock()
	return rp.faults
}

// SetFaults replaces the injected faults; requests arriving afterwards (for
// errors) or getting a serving slot afterwards (for stalls) see the new
// values. Setting StallRate to 0 also ends every stall in progress: those
// requests are then served normally. An invalid f is rejected and the
// current faults are kept.
func (rp *Replica) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	f = f.withDefaults()
	rp.faultMu.Lock()
	defer rp.faultMu.Unlock()
	rp.faults = f
	if f.StallRate == 0 {
		close(rp.stallRelease)
		rp.stallRelease = make(chan struct{})
	}
	return nil
}

func (rp *Replica) currentFaults() (Faults, <-chan struct{}) {
	rp.faultMu.Lock()
	defer rp.faultMu.Unlock()
	return rp.faults, rp.stallRelease
}

// Stats is a snapshot of a replica's counters.
type Stats struct {
	// Requests counts requests to the inference endpoints
	// (/v1/completions, /v1/chat/completions, /generate), whatever their outcome.
	Requests uint64
	// Served counts inference requests answered successfully and completely.
	Served uint64
	// Errors counts requests answered with an injected error.
	Errors uint64
	// Stalls counts requests that were stalled.
	Stalls uint64
	// Cancelled counts requests whose client went away before the response
	// was complete, while waiting or while being served.
	Cancelled uint64
	// Rejected counts invalid requests (400, 405, 413).
	Rejected uint64
	// Started counts requests that got a serving slot.
	Started uint64
	// PromptTokens and CompletionTokens sum the tokens of served requests.
	PromptTokens, CompletionTokens uint64
	// Running and Waiting are the requests holding a slot and queued now.
	Running, Waiting int
	// MaxRunning and MaxWaiting are the largest values seen.
	MaxRunning, MaxWaiting int
	// MaxInFlight is the largest Running + Waiting seen at once: the most
	// requests the replica held together, served or queued in its own
	// FIFO (a replica of Concurrency c never queued iff MaxInFlight ≤ c).
	MaxInFlight int
	// QueueWait sums the time the requests that got a slot spent waiting
	// for it in the replica's queue (QueueWait / Started: the mean wait);
	// Queued counts those that waited at all (the others were admitted on
	// arrival) and MaxQueueWait is the longest wait.
	QueueWait, MaxQueueWait time.Duration
	Queued                  uint64

	// Prefix cache counters (all zero when the cache is off), counted when
	// a request's service begins (after its slot and any stall). PrefixQueries is the sum of the
	// prompt tokens looked up and PrefixHits the sum of the cached prompt
	// tokens found (vLLM's prefix_cache_queries/hits, in tokens);
	// PrefixQueryBlocks and PrefixHitBlocks are the same in full blocks (a
	// request's hit blocks may exceed its cached tokens' share by one block:
	// its last prompt token is never counted as cached).
	PrefixQueries, PrefixHits          uint64
	PrefixQueryBlocks, PrefixHitBlocks uint64
	// PrefixCachedBlocks is the number of blocks in the cache now, out of
	// PrefixCapacityBlocks (the configured PrefixCache.Blocks).
	PrefixCachedBlocks, PrefixCapacityBlocks int

	// KV token accounting (zero when Config.KVCapacityTokens is 0):
	// KVTokens is the sum over running requests of their prompt tokens and
	// the output tokens generated so far, out of KVCapacityTokens.
	KVTokens, KVCapacityTokens int

	// Prefill line counters (zero unless Config.PrefillBlocksDecode):
	// Prefilling is the number of prefills running now (0 or 1) and
	// PrefillWaiting the running requests waiting for their turn to
	// prefill; MaxPrefilling is the largest number of prefills seen running
	// at once (never more than 1); Prefills counts the prefills started.
	Prefilling, PrefillWaiting, MaxPrefilling int
	Prefills                                  uint64
	// DecodeStall is the total time decode steps were paused by other
	// requests' prefills, summed over requests (a decode pause of d counts
	// once per request decoding meanwhile).
	DecodeStall time.Duration

	// Engine counters (zero unless Latency.Kind is LatencyEngine; the
	// fields above then describe the engine: Running is the batch, Waiting
	// its queue, Started the admissions, QueueWait the time spent queued,
	// and the prefix counters its KV blocks' prefix caching). Steps counts
	// the steps run; PrefillTokens and DecodeTokens sum the tokens they
	// scheduled; MaxStepTokens is the most in one step; Busy sums the
	// steps' durations, and StepWall the real time they took (above Busy
	// by how late a busy host ran them: a run whose StepWall is well above
	// its Busy measured the host more than the engine; with a shared GPU,
	// the wait for its turn counts too).
	Steps                       uint64
	PrefillTokens, DecodeTokens uint64
	MaxStepTokens               int
	Busy, StepWall              time.Duration
	// KVBlocksUsed is the number of blocks held by running requests (a
	// shared prompt block counts once), out of KVBlocks; KVBlocksCached
	// the free blocks still holding a cached prompt block (the LRU);
	// MaxKVBlocksUsed the largest KVBlocksUsed seen at an admission.
	KVBlocksUsed, KVBlocksCached, KVBlocks, MaxKVBlocksUsed int
}

// TokensPerStep returns the mean number of tokens an engine step
// scheduled, or 0 before any step.
func (s Stats) TokensPerStep() float64 {
	if s.Steps == 0 {
		return 0
	}
	return float64(s.PrefillTokens+s.DecodeTokens) / float64(s.Steps)
}

// KVUsage returns KVTokens / KVCapacityTokens clamped to 1 (with the
// engine, KVBlocksUsed / KVBlocks), or 0 when the KV capacity is off.
func (s Stats) KVUsage() float64 {
	if s.KVBlocks > 0 {
		return float64(s.KVBlocksUsed) / float64(s.KVBlocks)
	}
	if s.KVCapacityTokens <= 0 {
		return 0
	}
	return min(float64(s.KVTokens)/float64(s.KVCapacityTokens), 1)
}

// HitRate returns the replica-side prefix cache hit rate in tokens,
// PrefixHits / PrefixQueries, or 0 before any query.
func (s Stats) HitRate() float64 {
	if s.PrefixQueries == 0 {
		return 0
	}
	return float64(s.PrefixHits) / float64(s.PrefixQueries)
}

// BlockHitRate returns the prefix cache hit rate in blocks,
// PrefixHitBlocks / PrefixQueryBlocks, or 0 before any full block was
// looked up.
func (s Stats) BlockHitRate() float64 {
	if s.PrefixQueryBlocks == 0 {
		return 0
	}
	return float64(s.PrefixHitBlocks) / float64(s.PrefixQueryBlocks)
}

// Stats returns a snapshot of the replica's counters. Running and Waiting
// are mutually consistent; the counters are read one by one.
func (rp *Replica) Stats() Stats {
	qs := rp.q.snapshot()
	var pc prefixCacheStats
	if rp.cache != nil {
		pc = rp.cache.stats()
	}
	var ps prefillLineStats
	if rp.pl != nil {
		ps = rp.pl.stats()
	}
	st := Stats{
		Requests:         rp.requests.Load(),
		Served:           rp.served.Load(),
		Errors:           rp.errs.Load(),
		Stalls:           rp.stalls.Load(),
		Cancelled:        rp.cancelled.Load(),
		Rejected:         rp.rejected.Load(),
		Started:          qs.started,
		PromptTokens:     rp.promptTokens.Load(),
		CompletionTokens: rp.completionTokens.Load(),
		Running:          qs.running,
		Waiting:          qs.waiting,
		MaxRunning:       qs.maxRunning,
		MaxWaiting:       qs.maxWaiting,
		MaxInFlight:      qs.maxInFlight,
		QueueWait:        qs.waited,
		MaxQueueWait:     qs.maxWait,
		Queued:           qs.queued,

		PrefixQueries:        pc.queryTokens,
		PrefixHits:           pc.hitTokens,
		PrefixQueryBlocks:    pc.queryBlocks,
		PrefixHitBlocks:      pc.hitBlocks,
		PrefixCachedBlocks:   pc.blocks,
		PrefixCapacityBlocks: rp.cfg.PrefixCache.Blocks,

		KVTokens:         qs.kvUsed,
		KVCapacityTokens: rp.cfg.KVCapacityTokens,

		Prefilling:     ps.prefilling,
		PrefillWaiting: ps.waiting,
		MaxPrefilling:  ps.maxPrefilling,
		Prefills:       ps.prefills,
		DecodeStall:    ps.stall,
	}
	if rp.eng != nil {
		es := rp.eng.snapshot()
		st.Started, st.Queued = es.started, es.queued
		st.Running, st.Waiting = es.running, es.waiting
		st.MaxRunning, st.MaxWaiting, st.MaxInFlight = es.maxRunning, es.maxWaiting, es.maxInFlight
		st.QueueWait, st.MaxQueueWait = es.waited, es.maxWait
		st.PrefixQueries, st.PrefixHits = es.queryTokens, es.hitTokens
		st.PrefixQueryBlocks, st.PrefixHitBlocks = es.queryBlocks, es.hitBlocks
		st.Steps, st.PrefillTokens, st.DecodeTokens = es.steps, es.prefillTokens, es.decodeTokens
		st.MaxStepTokens, st.Busy, st.StepWall = es.maxStepTokens, es.busy, es.stepWall
		st.KVBlocksUsed, st.KVBlocksCached, st.KVBlocks = es.blocksUsed, es.blocksCached, rp.cfg.KVBlocks
		st.MaxKVBlocksUsed = es.maxBlocksUsed
	}
	return st
}

// Close shuts the replica down without waiting: queued and stalled requests
// and requests being served end at once (non-streaming ones with 503,
// streams are cut), and later requests get 503. The replica runs no
// goroutines of its own, so nothing of it is left running once its
// handlers have returned. Close is idempotent and always returns nil.
func (rp *Replica) Close() error {
	rp.lifeMu.Lock()
	if rp.closed {
		rp.lifeMu.Unlock()
		return nil
	}
	rp.closed = true
	close(rp.done)
	if rp.inflight == 0 {
		close(rp.drained)
	}
	rp.lifeMu.Unlock()
	rp.q.close()
	if rp.eng != nil {
		rp.eng.close() // after done is closed: the loop watches it
	}
	return nil
}

// cachesPrefixes reports whether the replica reports cached prompt tokens
// (a prefix cache, or the engine's KV blocks).
func (rp *Replica) cachesPrefixes() bool { return rp.cache != nil || rp.eng != nil }

// enter registers a handler; it fails once the replica is closed.
func (rp *Replica) enter() bool {
	rp.lifeMu.Lock()
	defer rp.lifeMu.Unlock()
	if rp.closed {
		return false
	}
	rp.inflight++
	return true
}

func (rp *Replica) leave() {
	rp.lifeMu.Lock()
	defer rp.lifeMu.Unlock()
	rp.inflight--
	if rp.closed && rp.inflight == 0 {
		close(rp.drained)
	}
}

// waitDrained waits until the replica is closed and all its handlers have
// returned, or ctx ends.
func (rp *Replica) waitDrained(ctx context.Context) error {
	select {
	case <-rp.drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (rp *Replica) record(status int) {
	rp.statusMu.Lock()
	rp.byStatus[status]++
	rp.statusMu.Unlock()
}

// chance reports whether an event of probability p happens.
func (rp *Replica) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	if p >= 1 {
		return true
	}
	rp.rngMu.Lock()
	defer rp.rngMu.Unlock()
	return rp.rng.Float64() < p
}

// serviceTime draws the total service time of a fixed or lognormal request.
func (rp *Replica) serviceTime() time.Duration {
	l := rp.cfg.Latency
	if l.Kind != LatencyLognormal || l.Sigma == 0 {
		return l.Duration
	}
	rp.rngMu.Lock()
	z := rp.rng.NormFloat64()
	rp.rngMu.Unlock()
	return clampDuration(math.Exp(lognormalMu(l.Duration, l.Sigma) + l.Sigma*z))
}

// prefillTime returns the prefill time of a request with promptTokens
// prompt tokens of which cached are in the prefix cache: Latency.Prefill
// (per_token) or Latency.PrefillPerToken (fixed, lognormal) per uncached
// token.
func (rp *Replica) prefillTime(promptTokens, cached int) time.Duration {
	l := rp.cfg.Latency
	per := l.PrefillPerToken
	if l.Kind == LatencyPerToken {
		per = l.Prefill
	}
	return clampDuration(float64(per) * float64(max(promptTokens-cached, 0)))
}

// decodeStep returns the current per-token decode time of the per_token model.
func (rp *Replica) decodeStep() time.Duration {
	l := rp.cfg.Latency
	if l.BatchSlowdown == 0 {
		return l.Decode
	}
	running, _ := rp.q.counts()
	return clampDuration(float64(l.Decode) * (1 + l.BatchSlowdown*float64(max(running-1, 0))))
}

func clampDuration(ns float64) time.Duration {
	const limit = float64(1 << 62)
	if !(ns > 0) {
		return 0
	}
	if ns > limit {
		return time.Duration(1 << 62)
	}
	return time.Duration(ns)
}

// ServeHTTP serves the simulated endpoints.
func (rp *Replica) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(HeaderReplica, rp.cfg.Name)
	if !rp.enter() {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "replica is shut down")
		return
	}
	defer rp.leave()

	switch r.URL.Path {
	case "/v1/completions":
		rp.serveInference(w, r, apiCompletions)
	case "/v1/chat/completions":
		rp.serveInference(w, r, apiChat)
	case "/generate":
		rp.serveInference(w, r, apiGenerate)
	case "/v1/models":
		if allowGet(w, r) {
			rp.serveModels(w)
		}
	case "/health":
		if allowGet(w, r) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}
	case "/metrics":
		if allowGet(w, r) {
			rp.serveMetrics(w)
		}
	default:
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	}
}

func allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path)
	return false
}

func (rp *Replica) serveModels(w http.ResponseWriter) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id":       rp.cfg.Model,
			"object":   "model",
			"created":  0,
			"owned_by": "sluice-sim",
		}},
	})
}

// serveInference runs one inference request through faults, the FIFO queue
// and the service-time model.
func (rp *Replica) serveInference(w http.ResponseWriter, r *http.Request, api apiKind) {
	rp.requests.Add(1)
	if r.Method != http.MethodPost {
		rp.rejected.Add(1)
		rp.record(http.StatusMethodNotAllowed)
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	req, status, err := rp.parseRequest(w, r)
	if err != nil {
		if status == statusClientGone {
			rp.cancelled.Add(1)
		} else {
			rp.rejected.Add(1)
			writeError(w, status, "invalid_request", err.Error())
		}
		rp.record(status)
		return
	}

	faults, stallRelease := rp.currentFaults()
	if rp.chance(faults.ErrorRate) {
		rp.errs.Add(1)
		rp.record(faults.ErrorStatus)
		writeError(w, faults.ErrorStatus, "simulated_fault", "injected error from replica "+rp.cfg.Name)
		return
	}

	if rp.eng != nil {
		rp.serveEngine(w, r, req, api)
		return
	}

	ctx := r.Context()
	kvHeld := 0 // KV tokens held by the request: prompt, then + generated
	if rp.cfg.KVCapacityTokens > 0 {
		kvHeld = req.PromptTokens
	}
	started := rp.startStreamEarly(w, req)
	seq, err := rp.q.acquireTokens(ctx, rp.done, kvHeld)
	if err != nil {
		rp.abandon(w, err, started)
		return
	}
	defer func() { rp.q.releaseTokens(kvHeld) }()
	setMeta(w, started, HeaderSeq, strconv.FormatUint(seq, 10))

	sl := sleeper{ctx: ctx, done: rp.done}
	defer sl.stop()

	// Stalls are decided when service begins, with the faults in effect then.
	faults, stallRelease = rp.currentFaults()
	if rp.chance(faults.StallRate) {
		rp.stalls.Add(1)
		if err := sl.sleep(faults.Stall, stallRelease); err != nil {
			rp.abandon(w, err, started)
			return
		}
	}

	g := &generation{rp: rp, api: api, req: req, seq: seq, created: time.Now().Unix(), started: started}
	if rp.cfg.KVCapacityTokens > 0 {
		g.kvHeld = &kvHeld
	}
	if rp.cache != nil {
		_, g.cached = rp.cache.lookup(req.Prefix, req.PromptTokens)
		setMeta(w, started, HeaderCachedTokens, strconv.Itoa(g.cached))
		// The blocks are stored once the prefill is done (in run), and
		// touched again when the request ends, served or not.
		defer func() {
			if g.prefilled {
				rp.cache.store(req.Prefix)
			}
		}()
	}
	rp.generate(w, g, &sl, req)
}

// startStreamEarly sends a streamed answer's status and headers now when
// the replica starts streams at once (Config.StreamHeaders immediate, the
// default), and reports whether it did. The headers declare HeaderSeq and
// HeaderCachedTokens as trailers: they are known only once the request is
// admitted (see setMeta).
func (rp *Replica) startStreamEarly(w http.ResponseWriter, req inferenceRequest) bool {
	if !req.Stream || rp.cfg.StreamHeaders == StreamHeadersFirstToken {
		return false
	}
	trailers := HeaderSeq
	if rp.cachesPrefixes() {
		trailers += ", " + HeaderCachedTokens
	}
	w.Header().Set("Trailer", trailers)
	startStream(w)
	return true
}

// setMeta sets the response header name to v, or, when the response has
// started (its headers went out early), the trailer name: net/http sends
// the headers named with http.TrailerPrefix as trailers after the last
// chunk of a chunked (HTTP/1.1) or HTTP/2 body, whatever the Trailer header
// declared. A client sees them in http.Response.Trailer after reading the
// body to EOF; an HTTP/1.0 client (no chunked encoding) does not get them.
func setMeta(w http.ResponseWriter, started bool, name, v string) {
	if started {
		name = http.TrailerPrefix + name
	}
	w.Header().Set(name, v)
}

// generate answers req with g (streamed or whole) and counts it served,
// or abandons it with the reason it failed.
func (rp *Replica) generate(w http.ResponseWriter, g *generation, sl *sleeper, req inferenceRequest) {
	var err error
	if req.Stream {
		err = g.stream(w, sl)
	} else {
		err = g.complete(w, sl)
	}
	if err != nil {
		rp.abandon(w, err, g.started)
		return
	}
	rp.served.Add(1)
	rp.promptTokens.Add(uint64(req.PromptTokens))
	rp.completionTokens.Add(uint64(req.OutputTokens))
	rp.record(http.StatusOK)
}

// abandon accounts for a request that could not complete: the replica was
// closed or the client went away. A closed replica answers 503 if the
// response has not started; a started stream is cut instead (the handler
// panics with http.ErrAbortHandler, which net/http and Caddy take as
// "close the connection / reset the stream" without logging), so that
// the client sees a broken stream, not a clean end of a short or empty
// 200 (with the headers sent at once, a request still queued at Close
// has a 200 on the wire already).
func (rp *Replica) abandon(w http.ResponseWriter, err error, started bool) {
	if errors.Is(err, errClosed) {
		rp.record(http.StatusServiceUnavailable)
		if started {
			panic(http.ErrAbortHandler)
		}
		writeError(w, http.StatusServiceUnavailable, "unavailable", "replica is shutting down")
		return
	}
	rp.cancelled.Add(1)
	rp.record(statusClientGone)
}

// sleeper waits on one reusable timer, giving up when the request's context
// ends or the replica closes.
type sleeper struct {
	ctx  context.Context
	done <-chan struct{}
	t    *time.Timer
}

// sleep waits for d. It returns nil early if release is closed, the context's
// error if the client goes away, and errClosed if the replica closes.
func (s *sleeper) sleep(d time.Duration, release <-chan struct{}) error {
	if d <= 0 {
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case <-s.done:
			return errClosed
		default:
			return nil
		}
	}
	if s.t == nil {
		s.t = time.NewTimer(d)
	} else {
		s.t.Reset(d) // Go ≥ 1.23 timers: no stale value can be received after Reset
	}
	select {
	case <-s.t.C:
		return nil
	case <-release:
		s.t.Stop()
		return nil
	case <-s.ctx.Done():
		s.t.Stop()
		return s.ctx.Err()
	case <-s.done:
		s.t.Stop()
		return errClosed
	}
}

func (s *sleeper) stop() {
	if s.t != nil {
		s.t.Stop()
	}
}
