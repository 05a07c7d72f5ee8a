package modelmetrics

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
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
	own    *http.Transport // the default transport, closed when Run ends; nil with Config.Client
	now    func() time.Time

	mu      sync.Mutex        // serializes SetTargets and Configure
	bases   map[string]string // the last SetTargets, to re-target on a new Path
	targets atomic.Pointer[map[string]*target]
	wake    chan struct{} // SetTargets added targets: scrape them now
	retick  chan struct{} // Configure changed the interval
	refresh chan struct{} // Refresh: a round now, at most every MinRefresh

	onSample atomic.Pointer[func(addr string, smp Sample)]

	ok, failed atomic.Uint64
}

type target struct {
	addr, url string
	busy      atomic.Bool // a scrape is running: the next round skips the target
	tried     atomic.Bool // a scrape was started at least once
	last      atomic.Pointer[Sample]
	buf       []byte // body buffer, reused; owned by the running scrape
}

// New returns a scraper with no targets; call Run to start scraping.
func New(cfg Config) *Scraper {
	cfg = cfg.WithDefaults()
	s := &Scraper{client: cfg.Client, now: time.Now, wake: make(chan struct{}, 1), retick: make(chan struct{}, 1),
		refresh: make(chan struct{}, 1)}
	s.cfg.Store(&cfg)
	if s.client == nil {
		// No proxy from the environment: replicas are internal addresses.
		s.own = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
		}
		s.client = &http.Client{Transport: s.own}
	}
	empty := map[string]*target{}
	s.targets.Store(&empty)
	return s
}

// SetTargets makes targets (dial address → base URL such as
// http://host:port; a bare host:port means http) the scraped set. Targets
// that stay keep their samples; removed ones are forgotten (Get says
// Unknown); new ones are scraped at once by a running Run.
func (s *Scraper) SetTargets(targets map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
// staleness and path all take effect at once; samples are kept. The
// Client is the one given to New.
func (s *Scraper) Configure(cfg Config) {
	cfg = cfg.WithDefaults()
	s.mu.Lock()
	old := s.Config()
	cfg.Client = old.Client
	s.cfg.Store(&cfg)
	bases := s.bases
	s.mu.Unlock()
	if cfg.Path != old.Path && bases != nil {
		s.SetTargets(bases)
	}
	if cfg.Interval != old.Interval {
		select {
		case s.retick <- struct{}{}:
		default:
		}
	}
}

// Run scrapes every target each Interval until ctx is done, then waits
// for the scrapes in progress and returns. Call it once.
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
	// A Refresh within MinRefresh of the last full round is held on this
	// timer (nil channel: none pending) and runs when the gap has passed.
	var held *time.Timer
	var heldC <-chan time.Time
	defer func() {
		if held != nil {
			held.Stop()
		}
	}()
	last := s.now()
	s.round(ctx, &wg, false)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.retick:
			tick.Reset(s.Config().Interval)
		case <-tick.C:
			last = s.now()
			s.round(ctx, &wg, false)
		case <-s.wake:
			s.round(ctx, &wg, true)
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
			last = s.now()
			s.round(ctx, &wg, false)
		case <-heldC:
			heldC = nil
			last = s.now()
			s.round(ctx, &wg, false)
		}
	}
}

// Refresh asks a running Run for a round of every target now rather than
// at the next Interval: for a caller holding requests on what the last
// samples said. Rounds come at most every Config.MinRefresh; a Refresh
// within it is served when it has passed, and Refreshes meanwhile are
// merged into that one. It never blocks.
func (s *Scraper) Refresh() {
	select {
	case s.refresh <- struct{}{}:
	default: // one is pending
	}
}

// OnSample makes fn receive every target's sample as soon as a scrape of
// it ends (a failed one too: the sample then carries Err), on the
// scrape's goroutine. fn must not block; nil removes it.
func (s *Scraper) OnSample(fn func(addr string, smp Sample)) {
	if fn == nil {
		s.onSample.Store(nil)
		return
	}
	s.onSample.Store(&fn)
}

// round starts one scrape per target (only never-tried ones with onlyNew),
// skipping targets whose previous scrape is still running.
func (s *Scraper) round(ctx context.Context, wg *sync.WaitGroup, onlyNew bool) {
	if ctx.Err() != nil {
		return
	}
	for _, t := range *s.targets.Load() {
		if onlyNew && t.tried.Load() {
			continue
		}
		if !t.busy.CompareAndSwap(false, true) {
			continue
		}
		t.tried.Store(true)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer t.busy.Store(false)
			s.scrape(ctx, t)
		}()
	}
}

// scrape reads one target and stores the outcome. A failure keeps the last
// values but sets Err, so the target reads Stale, never idle.
func (s *Scraper) scrape(runCtx context.Context, t *target) {
	ctx, cancel := context.WithTimeout(runCtx, s.Config().Timeout)
	defer cancel()
	v, err := s.fetch(ctx, t)
	if err != nil && runCtx.Err() != nil {
		return // shutting down: says nothing about the replica
	}
	var next Sample
	if err != nil {
		if prev := t.last.Load(); prev != nil {
			next = *prev
		}
		next.Err = err
		s.failed.Add(1)
	} else {
		next = v
		next.At = s.now()
		s.ok.Add(1)
	}
	t.last.Store(&next)
	if fn := s.onSample.Load(); fn != nil {
		(*fn)(t.addr, next)
	}
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
		return Sample{}, fmt.Errorf("modelmetrics: GET %s: %s", t.url, resp.Status)
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
	return *p, s.freshness(p)
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
}

// Snapshot lists every current target.
func (s *Scraper) Snapshot() []TargetStats {
	m := *s.targets.Load()
	out := make([]TargetStats, 0, len(m))
	for addr := range m {
		v, f := s.Get(addr)
		out = append(out, TargetStats{Addr: addr, Sample: v, Freshness: f})
	}
	return out
}

// Scrapes returns how many scrapes succeeded and failed so far.
func (s *Scraper) Scrapes() (ok, failed uint64) { return s.ok.Load(), s.failed.Load() }
