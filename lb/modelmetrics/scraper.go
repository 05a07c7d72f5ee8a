package modelmetrics

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Scraper polls one pool's replicas. Get is lock-free: the target set is
// an immutable map swapped on SetTargets, and each target's latest sample
// an immutable value swapped after each scrape.
type Scraper struct {
	cfg    atomic.Pointer[Config] // swapped whole by Configure
	client *http.Client
	own    *Transport // the default transport, closed when Run ends; nil with Config.Client
	now    func() time.Time
	// tlsGen counts the TLS configs own has had: a failure met under an
	// earlier one does not hold its target back (see outcome.tlsGen).
	tlsGen atomic.Uint64

	mu      sync.Mutex        // serializes SetTargets and Configure
	bases   map[string]string // the last SetTargets, to re-target on a new Path
	targets atomic.Pointer[map[string]*target]
	wake    chan struct{} // SetTargets added targets: scrape them now
	retick  chan struct{} // Configure changed the interval
	refresh chan struct{} // Refresh: a round now, at most every MinRefresh

	refreshMu  sync.Mutex          // guards the two below
	refreshAll bool                // Refresh asked for every target
	refreshSet map[string]struct{} // RefreshTargets asked for these

	onSample atomic.Pointer[func(addr string, smp Sample)]

	ok, failed atomic.Uint64
}

type target struct {
	addr, url string
	busy      atomic.Bool // a scrape is running: the next round skips the target
	tried     atomic.Bool // a scrape was started at least once
	last      atomic.Pointer[outcome]
	buf       []byte // body buffer, reused; owned by the running scrape
	// hookMu serializes the OnSample hooks of the target's scrapes: a
	// scrape's hook may run after the next scrape has ended (the target
	// is freed first), and must then not hand on the older sample last.
	hookMu sync.Mutex
}

// New returns a scraper with no targets; call Run to start scraping.
func New(cfg Config) *Scraper {
	cfg = cfg.WithDefaults()
	s := &Scraper{client: cfg.Client, now: time.Now, wake: make(chan struct{}, 1), retick: make(chan struct{}, 1),
		refresh: make(chan struct{}, 1), refreshSet: map[string]struct{}{}}
	s.cfg.Store(&cfg)
	if s.client == nil {
		s.own = NewTransport(cfg.TLS, TransportOptions{
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
			// The headers are bounded like the body (net/http's default
			// is 10 MiB, per scrape of each replica).
			MaxResponseHeaderBytes: maxHeaderBytes,
		})
		s.client = &http.Client{Transport: s.own, CheckRedirect: sameHost}
	}
	empty := map[string]*target{}
	s.targets.Store(&empty)
	return s
}

// maxHeaderBytes bounds a metrics response's headers.
const maxHeaderBytes = 64 << 10

// maxRedirects is net/http's default limit.
const maxRedirects = 10

// sameHost follows a redirect only on the replica itself (older vLLM
// answers /metrics with a redirect to /metrics/): a redirect to another
// host would pass that host's load off as the replica's, and have Sluice
// send requests wherever a replica points it.
func sameHost(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	if !strings.EqualFold(req.URL.Host, via[0].URL.Host) {
		return fmt.Errorf("redirect to another host (%s) not followed: a replica's load is read from the replica",
			quoteClipped([]byte(req.URL.Host)))
	}
	return nil
}

// SetTargets makes targets (dial address → base URL such as
// http://host:port; a bare host:port means http) the scraped set. Targets
// that stay keep their samples; removed ones are forgotten (Get says
// Unknown); new ones are scraped at once by a running Run.
func (s *Scraper) SetTargets(targets map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setTargetsLocked(targets)
}

func (s *Scraper) setTargetsLocked(targets map[string]string) {
	old := *s.targets.Load()
	next := make(map[string]*target, len(targets))
	added := false
	for addr, base := range targets {
		if !strings.Contains(base, "://") {
			base = "http://" + base
		}
		url := strings.TrimRight(base, "/") + s.Config().Path
		if t, ok := old[addr]; ok && t.url == url {
			next[addr] = t
			continue
		}
		next[addr] = &target{addr: addr, url: url}
		added = true
	}
	s.targets.Store(&next)
	s.bases = targets
	if added {
		select {
		case s.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// Config is the configuration the scraper runs with now.
func (s *Scraper) Config() Config { return *s.cfg.Load() }

// Configure applies cfg in place (a config reload): the interval, timeout,
// staleness, path and TLS settings all take effect at once; samples are
// kept. The Client is the one given to New. Another TLS config makes a new
// transport (the old one's connections are closed) and asks for a round
// (Refresh) in which targets backing off after failures met under the old
// config are scraped too: those failures may have been the old config's.
func (s *Scraper) Configure(cfg Config) {
	cfg = cfg.WithDefaults()
	s.mu.Lock()
	old := s.Config()
	cfg.Client = old.Client
	s.cfg.Store(&cfg)
	if cfg.Path != old.Path && s.bases != nil {
		// Under the lock: a SetTargets between reading the set and
		// applying it would be undone (its replicas forgotten).
		s.setTargetsLocked(s.bases)
	}
	s.mu.Unlock()
	if s.own != nil && s.own.SetTLS(cfg.TLS) {
		// After the swap: a scrape that read the new generation goes
		// through the new transport, so no failure of the old one is
		// taken for the new config's.
		s.tlsGen.Add(1)
		s.Refresh()
	}
	if cfg.Interval != old.Interval {
		select {
		case s.retick <- struct{}{}:
		default:
		}
	}
}

// Run scrapes every target each Interval (a failing one less often, see
// Config.MaxBackoff) until ctx is done, then waits for the scrapes in
// progress and returns. Call it once.
func (s *Scraper) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		if s.own != nil {
			s.own.CloseIdleConnections() // their reader goroutines end too
		}
	}()
	tick := time.NewTicker(s.Config().Interval)
	defer tick.Stop()
	// A Refresh within MinRefresh of the last round is held on this
	// timer (nil channel: none pending) and runs when the gap has passed.
	var held *time.Timer
	var heldC <-chan time.Time
	defer func() {
		if held != nil {
			held.Stop()
		}
	}()
	last := s.now()
	s.round(ctx, &wg, nil)
	spare := map[string]struct{}{}
	refreshRound := func() {
		all, want := s.takeRefresh(spare)
		switch {
		case all:
			last = s.now()
			s.round(ctx, &wg, nil)
		case len(want) > 0: // else an earlier round took them
			last = s.now()
			s.round(ctx, &wg, func(t *target) bool { _, ok := want[t.addr]; return ok })
		}
		clear(want)
		spare = want
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.retick:
			tick.Reset(s.Config().Interval)
		case <-tick.C:
			last = s.now()
			s.round(ctx, &wg, nil)
		case <-s.wake:
			s.round(ctx, &wg, func(t *target) bool { return !t.tried.Load() })
		case <-s.refresh:
			if heldC != nil {
				continue // one is already due
			}
			if wait := s.Config().MinRefresh - s.now().Sub(last); wait > 0 {
				if held == nil {
					held = time.NewTimer(wait)
				} else {
					held.Reset(wait)
				}
				heldC = held.C
				continue
			}
			refreshRound()
		case <-heldC:
			heldC = nil
			refreshRound()
		}
	}
}

// OnSample makes fn receive every target's sample as soon as a scrape of
// it ends (a failed one too: the sample then carries Err), on the
// scrape's goroutine; one call at a time per target, in scrape order (a
// sample already replaced by a newer scrape's is skipped). fn must not
// block; nil removes it.
func (s *Scraper) OnSample(fn func(addr string, smp Sample)) {
	if fn == nil {
		s.onSample.Store(nil)
		return
	}
	s.onSample.Store(&fn)
}

// round starts one scrape per target that want accepts (nil: all),
// skipping targets whose previous scrape is still running or whose
// back-off has not passed.
func (s *Scraper) round(ctx context.Context, wg *sync.WaitGroup, want func(*target) bool) {
	if ctx.Err() != nil {
		return
	}
	now, interval := s.now(), s.Config().Interval
	for _, t := range *s.targets.Load() {
		if want != nil && !want(t) {
			continue
		}
		if !t.busy.CompareAndSwap(false, true) {
			continue
		}
		if last := t.last.Load(); !last.dueAt(now, interval) && !last.failedUnderOldTLS(s.tlsGen.Load()) { // read while busy: no scrape can change it
			t.busy.Store(false)
			continue
		}
		t.tried.Store(true)
		wg.Add(1)
		go func() {
			defer wg.Done()
			stored := s.scrape(ctx, t, now)
			// Free the target before the hook runs: a hook that asks for
			// this target again (RefreshTargets) must find it free, or the
			// round it asks for skips it and the ask is lost.
			t.busy.Store(false)
			if fn := s.onSample.Load(); stored != nil && fn != nil {
				// One hook at a time per target, and none for a sample a
				// newer scrape has replaced (its own hook hands that on):
				// a slow hook overtaken by the next scrape's left the
				// consumer holding the older sample as the latest.
				t.hookMu.Lock()
				if t.last.Load() == stored {
					(*fn)(t.addr, stored.smp)
				}
				t.hookMu.Unlock()
			}
		}()
	}
}

// scrape reads one target, started at start, stores the outcome and
// returns it for the OnSample hook (nil: shutting down, nothing stored).
// A failure keeps the last values but sets Err, so the target reads
// Stale, never idle, and backs the target off.
func (s *Scraper) scrape(runCtx context.Context, t *target, start time.Time) *outcome {
	cfg, gen := s.Config(), s.tlsGen.Load()
	ctx, cancel := context.WithTimeout(runCtx, cfg.Timeout)
	defer cancel()
	v, err := s.fetch(ctx, t)
	if err != nil && runCtx.Err() != nil {
		return nil // shutting down: says nothing about the replica
	}
	var next outcome
	if err != nil {
		if prev := t.last.Load(); prev != nil {
			next = *prev
		}
		next.smp.Err = clipErr(err)
		next.fails++
		next.tlsGen = gen
		wait := cfg.MaxBackoff
		if !next.smp.At.IsZero() {
			// It exported metrics before: restarting, not metric-less.
			wait = min(wait, recoveringBackoff*cfg.Interval)
		}
		next.due = start.Add(backoff(cfg.Interval, wait, next.fails))
		s.failed.Add(1)
	} else {
		next.smp = v
		next.smp.At = s.now()
		if cfg.Settled != nil && cfg.Settled(v) {
			next.due = start.Add(cfg.SettledInterval)
		}
		s.ok.Add(1)
	}
	t.last.Store(&next)
	return &next
}

func (s *Scraper) fetch(ctx context.Context, t *target) (Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url, nil)
	if err != nil {
		return Sample{}, fmt.Errorf("modelmetrics: %w", err)
	}
	// The classic text format, not protobuf or anything a server may prefer.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := s.client.Do(req)
	if err != nil {
		return Sample{}, fmt.Errorf("modelmetrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
		// The replica's reason phrase: quoted, and cut, only if long.
		status := resp.Status
		if len(status) > maxQuoted {
			status = quoteClipped([]byte(status))
		}
		return Sample{}, fmt.Errorf("modelmetrics: GET %s: %s", t.url, status)
	}
	b := bytes.NewBuffer(t.buf[:0])
	_, err = b.ReadFrom(io.LimitReader(resp.Body, MaxBodyBytes+1))
	body := b.Bytes()
	if cap(body) <= 1<<20 {
		t.buf = body[:0] // keep a usual-sized buffer, not an exceptional one
	} else {
		t.buf = nil
	}
	if err != nil {
		return Sample{}, fmt.Errorf("modelmetrics: reading %s: %w", t.url, err)
	}
	if len(body) > MaxBodyBytes {
		return Sample{}, fmt.Errorf("modelmetrics: %s: body larger than %d bytes", t.url, MaxBodyBytes)
	}
	return Parse(body)
}

// maxErrText bounds the text of the error a failed scrape stores: it is
// kept per replica and shown by health, and may quote what the replica
// sent (a redirect's Location, up to maxHeaderBytes).
const maxErrText = 512

// clippedErr is an error whose text was cut to maxErrText; it still
// unwraps to the error it was cut from.
type clippedErr struct {
	msg string
	err error
}

func (e *clippedErr) Error() string { return e.msg }
func (e *clippedErr) Unwrap() error { return e.err }

// clipErr returns err, or err with its text cut to maxErrText.
func clipErr(err error) error {
	msg := err.Error()
	if len(msg) <= maxErrText {
		return err
	}
	return &clippedErr{msg: strings.ToValidUTF8(msg[:maxErrText], "") + "…", err: err}
}

// Get returns addr's latest sample and whether it may be trusted. It
// takes no lock and does not allocate.
func (s *Scraper) Get(addr string) (Sample, Freshness) {
	t := (*s.targets.Load())[addr]
	if t == nil {
		return Sample{}, Unknown
	}
	p := t.last.Load()
	if p == nil {
		return Sample{}, Unknown
	}
	return p.smp, s.freshness(&p.smp)
}

func (s *Scraper) freshness(p *Sample) Freshness {
	if p.Err != nil || p.At.IsZero() || s.now().Sub(p.At) > s.Config().Staleness {
		return Stale
	}
	return Fresh
}

// TargetStats is one target's view, for health output and metrics.
type TargetStats struct {
	Addr      string
	Sample    Sample
	Freshness Freshness
	// ConsecutiveFailures counts the failed scrapes since the last good
	// one; while it is above zero the target is not scraped before
	// NextScrape (the back-off, see Config.MaxBackoff).
	ConsecutiveFailures int
	NextScrape          time.Time
}

// Stats is addr's view (Unknown and zero if it is not a target).
func (s *Scraper) Stats(addr string) TargetStats {
	st := TargetStats{Addr: addr}
	t := (*s.targets.Load())[addr]
	if t == nil {
		return st
	}
	if p := t.last.Load(); p != nil {
		st.Sample, st.Freshness = p.smp, s.freshness(&p.smp)
		st.ConsecutiveFailures, st.NextScrape = p.fails, p.due
	}
	return st
}

// Snapshot lists every current target.
func (s *Scraper) Snapshot() []TargetStats {
	m := *s.targets.Load()
	out := make([]TargetStats, 0, len(m))
	for addr := range m {
		out = append(out, s.Stats(addr))
	}
	return out
}

// Scrapes returns how many scrapes succeeded and failed so far.
func (s *Scraper) Scrapes() (ok, failed uint64) { return s.ok.Load(), s.failed.Load() }
