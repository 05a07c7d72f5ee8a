package sim

import (
	"container/list"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// engine is the step loop of a LatencyEngine replica: a continuous-batching
// scheduler in the manner of vLLM V1 and transformers' continuous batching.
//
// Requests wait in a FIFO queue (waiting) until the loop admits them into
// the running batch. Each step, in order:
//
//  1. every running request whose prefill is done decodes one token;
//  2. running requests with an unfinished (chunked) prefill continue it,
//     within what is left of the step's token budget (MaxBatchTokens);
//  3. waiting requests are admitted in FIFO order while the batch is below
//     Concurrency (max_num_seqs), budget is left and their KV blocks fit; a
//     head that does not fit holds back the rest. An admitted request
//     starts its prefill in the same step, chunked by the budget left.
//
// The step then lasts StepBase + StepPerToken × tokens scheduled +
// StepPerContextToken × the context they attend to (each scheduled
// request's prompt and output tokens so far, cached prefix included, up to
// the end of what the step computes); when it ends, the decodes get their
// token, and a request whose prefill completed gets its first token.
// Arrivals during a step wait for its end; with AsyncScheduling the next
// step was planned when this one started, so they wait for the end of the
// next one (the plan only admits requests that had arrived when the step
// in flight started; an engine with nothing in flight plans at once).
//
// KV cache: KVBlocks blocks of BlockTokens tokens. Admission reserves every
// block the request can need, ⌈(prompt + max output tokens) / BlockTokens⌉,
// less the blocks its prompt shares with the cache, so a running request
// never runs out of KV and nothing is ever preempted (unlike vLLM, which
// allocates as it decodes and preempts when it runs out). Prompt blocks are
// keyed by the whole prompt text up to their end (as the prefix cache of
// prefix.go, with blocks of BlockTokens × 4 characters); a full prompt
// block is registered in the cache as soon as its tokens are computed, and
// later requests whose prompt starts the same share it, held by running
// requests (pinned, counted once) or lying in the LRU of free cached blocks.
// Shared blocks need no prefill; the last prompt token is always computed.
// When a request ends its registered blocks join the LRU (its first block as
// the most recent), its other blocks are freed; an admission that needs
// room evicts the least recently used cached blocks.
//
// The loop runs on its own goroutine while the engine has requests and
// exits when it has none or the replica closes (close waits for it).
// Requests are served on their handler goroutines, which wait on ready for
// their tokens; a handler that gives up removes its request at once,
// freeing its place in the queue or its seat in the batch and its blocks.
type engine struct {
	stepBase, stepPerToken time.Duration
	stepPerContextToken    time.Duration
	async                  bool
	gpu                    *GPU // shared with other engines; nil: its own
	maxSeqs                int
	maxBatchTokens         int
	blockTokens, kvBlocks  int
	done                   <-chan struct{} // the replica's; closed by Close

	wg sync.WaitGroup // the loop goroutine

	mu      sync.Mutex
	closed  bool
	loopOn  bool
	waiting list.List // of *engineReq, FIFO
	running []*engineReq

	blocks  map[uint64]*kvBlock // registered prompt blocks: pinned or in lru
	lru     list.List           // of *kvBlock with no reference; front = most recent
	free    int                 // blocks holding nothing
	private int                 // blocks reserved by running requests, not registered
	pinned  int                 // registered blocks referenced by running requests

	st engineStats
}

// kvBlock is a registered (prefix-cacheable) prompt block.
type kvBlock struct {
	key  uint64
	refs int           // running requests holding it
	elem *list.Element // in the LRU while refs == 0
}

// Request states.
const (
	reqWaiting = iota
	reqRunning
	reqDone // finished or removed
)

// engineReq is one request in the engine.
type engineReq struct {
	prompt, out int
	prefix      promptPrefix // keys at most total blocks
	total       int          // blocks reserved at admission, shared ones included

	state int
	elem  *list.Element // in waiting
	since time.Time     // when it joined the queue
	seq   uint64        // admission order, 1-based

	hits      int // prompt blocks shared at admission
	cached    int // prompt tokens those blocks cover
	left      int // prompt tokens still to prefill
	computed  int // prompt tokens computed or cached
	next      int // index of the next prompt block to register
	shared    []*kvBlock
	reserved  int // private blocks held
	generated int

	ready chan struct{} // capacity 1: a token came, or the request was admitted
}

type engineStats struct {
	started, queued             uint64
	waited, maxWait             time.Duration
	maxRunning, maxWaiting      int
	maxInFlight                 int
	steps                       uint64
	prefillTokens, decodeTokens uint64
	maxStepTokens               int
	busy                        time.Duration
	// stepWall is the real time the steps took, from each one's start to
	// its tokens applied: above busy by the host's lateness.
	stepWall               time.Duration
	queryTokens, hitTokens uint64
	queryBlocks, hitBlocks uint64
	maxBlocksUsed          int
}

func newEngine(cfg Config, done <-chan struct{}) *engine {
	return &engine{
		stepBase:            cfg.Latency.StepBase,
		stepPerToken:        cfg.Latency.StepPerToken,
		stepPerContextToken: cfg.Latency.StepPerContextToken,
		async:               cfg.Latency.AsyncScheduling,
		gpu:                 cfg.GPU,
		maxSeqs:             cfg.Concurrency,
		maxBatchTokens:      cfg.MaxBatchTokens,
		blockTokens:         cfg.BlockTokens,
		kvBlocks:            cfg.KVBlocks,
		done:                done,
		blocks:              make(map[uint64]*kvBlock),
		free:                cfg.KVBlocks,
	}
}

// blockChars is the size of a block in characters of prompt text.
func (e *engine) blockChars() int { return e.blockTokens * 4 }

// newRequest sizes a request. fits is false when it needs more blocks than
// the whole cache has: it could never be admitted.
func (e *engine) newRequest(prompt, out int, prefix promptPrefix) (r *engineReq, fits bool) {
	total := (prompt + out + e.blockTokens - 1) / e.blockTokens
	if len(prefix.keys) > total {
		// Text longer than 4 characters per token (token ids, chat markup):
		// never register more blocks than the request holds.
		prefix.keys = prefix.keys[:total]
	}
	r = &engineReq{prompt: prompt, out: out, prefix: prefix, total: total, ready: make(chan struct{}, 1)}
	return r, total <= e.kvBlocks
}

// submit queues r and makes sure the loop runs. It fails once the engine
// is closed.
func (e *engine) submit(r *engineReq) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errClosed
	}
	r.since = time.Now()
	r.state = reqWaiting
	r.elem = e.waiting.PushBack(r)
	e.st.maxWaiting = max(e.st.maxWaiting, e.waiting.Len())
	e.st.maxInFlight = max(e.st.maxInFlight, e.waiting.Len()+len(e.running))
	if !e.loopOn {
		e.loopOn = true
		e.wg.Add(1)
		go e.loop()
	}
	return nil
}

// remove takes r out of the engine (a client that went away, or the end of
// its handler): out of the queue, or out of the batch with its blocks
// freed. It is a no-op for a request already done.
func (e *engine) remove(r *engineReq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch r.state {
	case reqWaiting:
		e.waiting.Remove(r.elem)
		r.elem = nil
		r.state = reqDone
	case reqRunning:
		e.finishLocked(r)
	}
}

// progress returns r's tokens so far and whether it has been admitted.
func (e *engine) progress(r *engineReq) (generated int, admitted bool, seq uint64, cached int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return r.generated, r.seq != 0, r.seq, r.cached
}

// close stops the loop and waits for it. The replica's done channel must be
// closed first: the loop's step wait and the handlers watch it.
func (e *engine) close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.wg.Wait()
}

// stepItem is one request's share of a step: a decode token or a prefill
// chunk of n tokens.
type stepItem struct {
	r      *engineReq
	n      int
	decode bool
}

func (e *engine) loop() {
	defer e.wg.Done()
	timer := time.NewTimer(forever)
	defer timer.Stop()
	var work []stepItem
	var inFlight time.Time // start of the step that just ended; zero before the first
	for {
		e.mu.Lock()
		if e.closed {
			e.loopOn = false
			e.mu.Unlock()
			return
		}
		var tokens, context int
		work, tokens, context = e.planStepLocked(work[:0], inFlight)
		if len(work) == 0 {
			// Idle: the next submit starts a new loop.
			e.loopOn = false
			e.mu.Unlock()
			return
		}
		d := e.stepBase + time.Duration(tokens)*e.stepPerToken + time.Duration(context)*e.stepPerContextToken
		inFlight = time.Now()
		e.st.steps++
		e.st.maxStepTokens = max(e.st.maxStepTokens, tokens)
		e.st.busy += d
		e.mu.Unlock()
		if e.gpu != nil {
			// The step's GPU work waits its turn behind the other engines'.
			d = time.Until(e.gpu.stepEnd(inFlight, d, e.stepBase))
		}

		if d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-e.done:
				e.exit()
				return
			}
		} else {
			select {
			case <-e.done:
				e.exit()
				return
			default:
			}
		}

		e.mu.Lock()
		e.applyLocked(work)
		e.st.stepWall += time.Since(inFlight)
		e.mu.Unlock()
		clear(work) // drop the references to finished requests
	}
}

func (e *engine) exit() {
	e.mu.Lock()
	e.loopOn = false
	e.mu.Unlock()
}

// planStepLocked plans the step that follows the one that started at
// inFlight (zero: none did). With async scheduling that plan was made when
// the step in flight started, so it admits only the requests that had
// arrived by then; if it has nothing to run, the engine, idle, plans again
// at once with every request.
func (e *engine) planStepLocked(work []stepItem, inFlight time.Time) ([]stepItem, int, int) {
	if !e.async || inFlight.IsZero() {
		return e.planLocked(work, time.Time{})
	}
	work, tokens, context := e.planLocked(work, inFlight)
	if len(work) == 0 {
		return e.planLocked(work, time.Time{})
	}
	return work, tokens, context
}

// planLocked schedules one step: decodes, then chunked prefills of running
// requests, then FIFO admissions of the requests that arrived by cutoff
// (all of them when cutoff is zero). It returns the step's items, its
// tokens and the context they attend to.
func (e *engine) planLocked(work []stepItem, cutoff time.Time) ([]stepItem, int, int) {
	budget := e.maxBatchTokens
	context := 0
	for _, r := range e.running {
		if r.left == 0 {
			// MaxBatchTokens ≥ Concurrency: every decode fits.
			work = append(work, stepItem{r: r, n: 1, decode: true})
			budget--
			context += r.prompt + r.generated
		}
	}
	for _, r := range e.running {
		if r.left > 0 && budget > 0 {
			n := min(r.left, budget)
			work = append(work, stepItem{r: r, n: n})
			budget -= n
			context += r.computed + n
		}
	}
	for budget > 0 && len(e.running) < e.maxSeqs {
		front := e.waiting.Front()
		if front == nil {
			break
		}
		r := front.Value.(*engineReq)
		if !cutoff.IsZero() && r.since.After(cutoff) {
			break // not arrived when this step was planned (nor the ones behind it)
		}
		if !e.admitLocked(r) {
			break // strict FIFO: the head holds back the rest
		}
		n := min(r.left, budget)
		work = append(work, stepItem{r: r, n: n})
		budget -= n
		context += r.computed + n
	}
	return work, e.maxBatchTokens - budget, context
}

// admitLocked moves the queue's head r into the batch if its blocks fit:
// its leading prompt blocks found in the cache are shared (pinned), the
// rest of its reservation is taken from free blocks, evicting cached ones
// from the LRU's tail as needed.
func (e *engine) admitLocked(r *engineReq) bool {
	// The last prompt token is always computed, so at most
	// ⌊(prompt−1)/BlockTokens⌋ blocks can be hits.
	maxHits := min(len(r.prefix.keys), (r.prompt-1)/e.blockTokens)
	hits, hitsInLRU := 0, 0
	for _, k := range r.prefix.keys[:maxHits] {
		b, ok := e.blocks[k]
		if !ok {
			break
		}
		hits++
		if b.refs == 0 {
			hitsInLRU++
		}
	}
	need := r.total - hits
	if need > e.free+e.lru.Len()-hitsInLRU {
		return false
	}
	e.waiting.Remove(r.elem)
	r.elem = nil

	r.shared = make([]*kvBlock, 0, len(r.prefix.keys))
	for _, k := range r.prefix.keys[:hits] {
		b := e.blocks[k]
		if b.refs == 0 {
			e.lru.Remove(b.elem)
			b.elem = nil
			e.pinned++
		}
		b.refs++
		r.shared = append(r.shared, b)
	}
	for e.free < need {
		e.evictLocked()
	}
	e.free -= need
	e.private += need
	r.reserved = need
	r.hits = hits
	r.next = hits
	r.cached = r.prefix.cachedTokens(hits, e.blockChars(), r.prompt)
	r.computed = r.cached
	r.left = r.prompt - r.cached
	r.state = reqRunning
	e.running = append(e.running, r)

	e.st.started++
	r.seq = e.st.started
	if wait := time.Since(r.since); wait > 0 {
		e.st.waited += wait
		e.st.maxWait = max(e.st.maxWait, wait)
		e.st.queued++
	}
	e.st.maxRunning = max(e.st.maxRunning, len(e.running))
	e.st.maxBlocksUsed = max(e.st.maxBlocksUsed, e.pinned+e.private)
	e.st.queryTokens += uint64(r.prompt)
	e.st.hitTokens += uint64(r.cached)
	e.st.queryBlocks += uint64(r.prefix.fullBlocks)
	e.st.hitBlocks += uint64(hits)
	notify(r)
	return true
}

// evictLocked frees the least recently used cached block.
func (e *engine) evictLocked() {
	back := e.lru.Back()
	b := e.lru.Remove(back).(*kvBlock)
	delete(e.blocks, b.key)
	e.free++
}

// applyLocked ends a step: tokens for the decodes, prefill progress (and
// first tokens) for the prefills, and the end of finished requests.
// Requests removed during the step are skipped.
func (e *engine) applyLocked(work []stepItem) {
	for _, it := range work {
		r := it.r
		if r.state != reqRunning {
			continue
		}
		if it.decode {
			r.generated++
			e.st.decodeTokens++
		} else {
			r.left -= it.n
			r.computed += it.n
			e.st.prefillTokens += uint64(it.n)
			e.registerLocked(r)
			if r.left == 0 {
				r.generated = 1 // the prefill's last position yields the first token
			}
		}
		if r.generated >= r.out {
			e.finishLocked(r)
		}
		notify(r)
	}
}

// registerLocked puts r's newly computed full prompt blocks in the cache.
// A block another request registered meanwhile (the same prompt prefilled
// twice at once) stays private to r, as in vLLM.
func (e *engine) registerLocked(r *engineReq) {
	done := len(r.prefix.keys)
	if r.left > 0 && r.prefix.textLen > 0 {
		// Computed tokens → characters of text → full blocks.
		done = min(done, int(int64(r.computed)*int64(r.prefix.textLen)/int64(r.prompt)/int64(e.blockChars())))
	}
	for ; r.next < done; r.next++ {
		k := r.prefix.keys[r.next]
		if _, ok := e.blocks[k]; ok || r.reserved == 0 {
			continue
		}
		b := &kvBlock{key: k, refs: 1}
		e.blocks[k] = b
		r.shared = append(r.shared, b)
		r.reserved--
		e.private--
		e.pinned++
	}
}

// finishLocked takes a running request out of the batch: its registered
// blocks go to the LRU, last block first so that its first block is the
// most recently used (a prompt's tail is evicted before its head), its
// other blocks are freed.
func (e *engine) finishLocked(r *engineReq) {
	if i := slices.Index(e.running, r); i >= 0 {
		e.running = slices.Delete(e.running, i, i+1) // zeroes the vacated slot
	}
	for i := len(r.shared) - 1; i >= 0; i-- {
		b := r.shared[i]
		b.refs--
		if b.refs == 0 {
			e.pinned--
			b.elem = e.lru.PushFront(b)
		}
	}
	r.shared = nil
	e.free += r.reserved
	e.private -= r.reserved
	r.reserved = 0
	r.state = reqDone
}

// notify wakes r's handler without blocking (one pending wake is enough:
// the handler reads the progress under the lock).
func notify(r *engineReq) {
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

// engineSnapshot is a consistent view of the engine for Stats and metrics.
type engineSnapshot struct {
	engineStats
	running, waiting         int
	blocksUsed, blocksCached int
	blocksPinned, blocksFree int
}

func (e *engine) snapshot() engineSnapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	return engineSnapshot{
		engineStats:  e.st,
		running:      len(e.running),
		waiting:      e.waiting.Len(),
		blocksUsed:   e.pinned + e.private,
		blocksCached: e.lru.Len(),
		blocksPinned: e.pinned,
		blocksFree:   e.free,
	}
}

// serveEngine serves an inference request on the engine: its stream
// started at once (the default), then an injected stall (decided now,
// before the request joins the engine's queue), then the queue, the batch
// and the tokens as the steps produce them.
func (rp *Replica) serveEngine(w http.ResponseWriter, r *http.Request, req inferenceRequest, api apiKind) {
	er, fits := rp.eng.newRequest(req.PromptTokens, req.OutputTokens, req.Prefix)
	if !fits {
		rp.rejected.Add(1)
		rp.record(http.StatusBadRequest)
		writeError(w, http.StatusBadRequest, "invalid_request",
			"prompt tokens + max tokens ("+strconv.Itoa(req.PromptTokens+req.OutputTokens)+") need "+
				strconv.Itoa(er.total)+" KV blocks, more than the replica's "+strconv.Itoa(rp.eng.kvBlocks))
		return
	}
	// After validation, before the stall and the queue: a stalled replica
	// has accepted the request (as the slot queue's stall comes after it).
	started := rp.startStreamEarly(w, req)
	sl := sleeper{ctx: r.Context(), done: rp.done}
	defer sl.stop()
	faults, stallRelease := rp.currentFaults()
	if rp.chance(faults.StallRate) {
		rp.stalls.Add(1)
		if err := sl.sleep(faults.Stall, stallRelease); err != nil {
			rp.abandon(w, err, started)
			return
		}
	}
	if err := rp.eng.submit(er); err != nil {
		rp.abandon(w, err, started)
		return
	}
	defer rp.eng.remove(er) // frees the seat and blocks of a request that did not finish

	g := &generation{rp: rp, api: api, req: req, created: time.Now().Unix(), er: er, started: started}
	g.onAdmit = func() {
		setMeta(w, started, HeaderSeq, strconv.FormatUint(g.seq, 10))
		setMeta(w, started, HeaderCachedTokens, strconv.Itoa(g.cached))
	}
	rp.generate(w, g, &sl, req)
}

// runEngine is generation.run for the engine: it waits for the engine's
// tokens and emits them in chunks of chunk tokens (the last one shorter).
func (g *generation) runEngine(sl *sleeper, chunk int, emit func(from, to int) error) error {
	e, r := g.rp.eng, g.er
	n := g.req.OutputTokens
	admitted := false
	for from := 0; ; {
		generated, in, seq, cached := e.progress(r)
		if in && !admitted {
			admitted = true
			g.seq, g.cached = seq, cached
			if g.onAdmit != nil {
				g.onAdmit()
			}
		}
		for from < generated && (generated-from >= chunk || generated == n) {
			to := min(from+chunk, generated)
			if emit != nil {
				if err := emit(from, to); err != nil {
					return err
				}
			}
			from = to
		}
		if from == n {
			return nil
		}
		select {
		case <-r.ready:
		case <-sl.ctx.Done():
			return sl.ctx.Err()
		case <-sl.done:
			return errClosed
		}
	}
}
