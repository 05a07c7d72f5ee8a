package loadaware

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/tracker"
)

// PickerConfig is everything a load_aware pool runs with.
type PickerConfig struct {
	Policy  Config
	Metrics modelmetrics.Config
	Tracker tracker.Config
	// PrefixIndexSize bounds the index of routed prompt prefixes that
	// decides hot or cold for no_hit_lru, in characters (default 4Mi).
	PrefixIndexSize int
	// SessionKey keys the session tokens (HMAC): instances that share it
	// hand out the same token for a replica; empty means a fixed key (the
	// tokens are then only opaque, not unguessable).
	SessionKey string
}

// DefaultPrefixIndexSize is PrefixIndexSize's default.
const DefaultPrefixIndexSize = 4 << 20

// WithDefaults fills zero fields.
func (c PickerConfig) WithDefaults() PickerConfig {
	c.Policy = c.Policy.WithDefaults()
	c.Metrics = c.Metrics.WithDefaults()
	c.Tracker = c.Tracker.WithDefaults() // what the tracker runs with, so Config shows it
	if c.PrefixIndexSize == 0 {
		c.PrefixIndexSize = DefaultPrefixIndexSize
	}
	return c
}

// Validate names the first bad setting.
func (c PickerConfig) Validate() error {
	c = c.WithDefaults()
	if err := c.Policy.Validate(); err != nil {
		return err
	}
	if err := c.Metrics.Validate(); err != nil {
		return err
	}
	if err := (cacheaware.Config{MaxTreeSize: c.PrefixIndexSize}).WithDefaults().Validate(); err != nil {
		return fmt.Errorf("prefix index: %v", err)
	}
	return nil
}

// Picker is the load-aware policy's lb.Picker: the scorers (Policy), the
// exact in-flight counts (tracker), the replicas' own metrics (scraper),
// the prefix index that tells hot from cold, and the session tokens.
type Picker struct {
	policy   *Policy
	tracker  *tracker.Tracker
	scraper  *modelmetrics.Scraper
	prefixes *cacheaware.Router

	mu     sync.Mutex // serializes SetBackends and Configure
	cfg    atomic.Pointer[PickerConfig]
	addrs  atomic.Pointer[[]string]
	tokens atomic.Pointer[map[string]string] // session token → addr
	byAddr atomic.Pointer[map[string]string] // addr → session token (each response carries one)

	// Explain, if set before the picker is used, receives every ranking
	// (for a debug log); Explaining, if set, says whether it is wanted now
	// (an explanation costs a map and a slice per scorer on every pick).
	Explain    func(Explanation)
	Explaining func() bool
}

func (p *Picker) explaining() bool {
	return p.Explain != nil && (p.Explaining == nil || p.Explaining())
}

// NewPicker returns a picker with no replicas; Run its loops.
func NewPicker(cfg PickerConfig) *Picker {
	cfg = cfg.WithDefaults()
	p := &Picker{
		policy:   New(cfg.Policy),
		tracker:  tracker.New(cfg.Tracker),
		scraper:  modelmetrics.New(cfg.Metrics),
		prefixes: cacheaware.New(cacheaware.Config{MaxTreeSize: cfg.PrefixIndexSize}),
	}
	p.cfg.Store(&cfg)
	empty, tokens, byAddr := []string{}, map[string]string{}, map[string]string{}
	p.addrs.Store(&empty)
	p.tokens.Store(&tokens)
	p.byAddr.Store(&byAddr)
	return p
}

// Configure applies every setting in place, keeping counts, samples,
// the prefix index and session tokens (re-keyed if the key changed).
func (p *Picker) Configure(cfg PickerConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.WithDefaults()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.policy.Configure(cfg.Policy)
	p.tracker.Configure(cfg.Tracker)
	p.scraper.Configure(cfg.Metrics)
	p.prefixes.Configure(cacheaware.Config{MaxTreeSize: cfg.PrefixIndexSize})
	p.cfg.Store(&cfg)
	p.retokenLocked(*p.addrs.Load())
	return nil
}

// Config is the configuration in force.
func (p *Picker) Config() PickerConfig { return *p.cfg.Load() }

// Run scrapes metrics and trims the prefix index until ctx ends.
func (p *Picker) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.scraper.Run(ctx) }()
	go func() { defer wg.Done(); p.prefixes.Run(ctx) }()
	wg.Wait()
}

// Tracker, Scraper and Policy give metrics and health their view.
func (p *Picker) Tracker() *tracker.Tracker      { return p.tracker }
func (p *Picker) Scraper() *modelmetrics.Scraper { return p.scraper }
func (p *Picker) Policy() *Policy                { return p.policy }

// SetReplicas implements lb.Picker; metrics are scraped at http://addr.
func (p *Picker) SetReplicas(addrs []string) {
	p.SetBackends(lb.PlainBackends(addrs))
}

// SetBackends makes set the replicas, scraping each at its URL.
func (p *Picker) SetBackends(set []lb.Backend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	addrs := lb.Dials(set)
	targets := make(map[string]string, len(set))
	keep := make(map[string]bool, len(set))
	for _, b := range set {
		targets[b.Dial] = b.URL
		keep[b.Dial] = true
	}
	// The new replicas join the tracker before picks read the new list,
	// and the old ones leave it only after: a pick that read the old list
	// finds its replicas, or finds the list changed (rankAndAcquire).
	p.tracker.SetReplicas(slices.Concat(*p.addrs.Load(), addrs))
	p.prefixes.SetReplicas(addrs)
	p.policy.Forget(keep)
	p.scraper.SetTargets(targets)
	p.retokenLocked(addrs)
	p.addrs.Store(&addrs)
	p.tracker.SetReplicas(addrs)
}

func (p *Picker) retokenLocked(addrs []string) {
	tokens := make(map[string]string, len(addrs))
	byAddr := make(map[string]string, len(addrs))
	for _, a := range addrs {
		t := p.computeToken(a)
		tokens[t], byAddr[a] = a, t
	}
	p.tokens.Store(&tokens)
	p.byAddr.Store(&byAddr)
}

// ReadsText reports whether picks read the prompt's text: only
// no_hit_lru's prefix index does; the other scorers weigh a request by
// its token counts.
func (p *Picker) ReadsText() bool { return p.cfg.Load().Policy.Weights[NoHitLRU] > 0 }

// HandsOutSessions says whether responses should carry the session token:
// only the session_affinity scorer reads it back, so without it a token
// would promise an affinity nobody keeps.
func (p *Picker) HandsOutSessions() bool {
	return p.cfg.Load().Policy.Weights[SessionAffinity] > 0
}

// SessionToken is the opaque, stable token for a replica: an HMAC of its
// address, so it reveals no address, survives restarts and is the same on
// every instance configured with the same key. Tokens of the set's
// replicas are computed once per set or key change, not per response.
func (p *Picker) SessionToken(addr string) string {
	if t, ok := (*p.byAddr.Load())[addr]; ok {
		return t
	}
	return p.computeToken(addr)
}

func (p *Picker) computeToken(addr string) string {
	key := p.Config().SessionKey
	if key == "" {
		key = "sluice-session"
	}
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(addr))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:12])
}

// InFlight implements lb.Picker.
func (p *Picker) InFlight() map[string]int { return p.tracker.PerReplica() }

// Explanation is one ranking, for a debug log.
type Explanation struct {
	Picked     string
	Hot        bool
	Session    string
	Shift      float64
	Candidates []Candidate
	Rank       Ranking
}

// String renders every scorer's score per replica.
func (e Explanation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "picked=%s hot=%t session=%q shift=%.3f", e.Picked, e.Hot, e.Session, e.Shift)
	for i, c := range e.Candidates {
		fmt.Fprintf(&b, " | %s total=%.3f", c.Addr, e.Rank.Total[i])
		if c.Even {
			b.WriteString(" even")
		}
		for _, name := range AllScorers {
			if s, ok := e.Rank.Scores[name]; ok {
				fmt.Fprintf(&b, " %s=%.3f", name, s[i])
			}
		}
	}
	return b.String()
}

// fallbackMemo is the rest of a request's ranking, tried on retries.
type fallbackMemo struct {
	order []string
	small [smallPool - 1]string // order's storage in a small pool: one allocation
}

// smallPool is the pool size up to which a pick's candidates stay on the
// stack.
const smallPool = 8

// Pick implements lb.Picker. A retry (req.Attempt > 0) takes the next
// usable replica of the first pick's order; otherwise every usable
// replica not in req.Unavailable is scored and the best one that can
// still be acquired wins, the rest kept as the fallback order.
func (p *Picker) Pick(ctx context.Context, req *lb.Request) (lb.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if fb, ok := req.Memo.(*fallbackMemo); ok && req.Attempt > 0 {
		for len(fb.order) > 0 {
			addr := fb.order[0]
			fb.order = fb.order[1:]
			if !req.Excluded(addr) {
				if l := p.tracker.AcquireUsable(addr, req.Tokens); l != nil {
					req.Reason = lb.ReasonFallback
					return p.lease(l, p.policy.settings().slo), nil
				}
			}
		}
	}
	st := p.policy.settings()
	facts := RequestFacts{SessionAddr: p.sessionAddr(req.Session)}
	// Hot or cold matters only to no_hit_lru: without it the prefix index
	// and the cold history are not kept (a radix-tree walk and insert per
	// request, for nothing).
	lru := st.uses(NoHitLRU)
	if lru && req.Parsed && req.Text != "" {
		d := p.prefixes.Pick(req.Model, req.Text, nil)
		facts.Hot = d.MatchedChars >= st.hotPrefixChars
	}
	// Counts are read now, after the body was read: a burst of picks must
	// rank fresh counts, not the zeros they all saw on arrival.
	now := time.Now()
	// A ranking's choices can all be lost before they are acquired: removed
	// by a set-backends, or a recovering replica's one probe taken by
	// another pick. The next ranking sees them gone (or busy probing) and
	// the set in force. A ranking lost to a set-backends counts against a
	// bound of its own: sets posted back to back must not fail a request
	// while each has replicas.
	for lost, changed := 0, 0; lost < pickTries && changed < maxSetChanges; {
		list := p.addrs.Load()
		if l, err := p.rankAndAcquire(req, &st, facts, lru, now, list); l != nil || err != nil {
			return l, err
		}
		if p.addrs.Load() != list {
			changed++
		} else {
			lost++
		}
	}
	return nil, lb.ErrNoBackends
}

// pickTries bounds the rankings of one pick that lose their choices with
// the set unchanged (a recovering replica's probe taken); maxSetChanges
// those that a set-backends overtook (see Pick).
const (
	pickTries     = 4
	maxSetChanges = 64
)

// rankAndAcquire ranks the usable replicas of list, the set in force,
// and acquires the best it can; nil and no error when every one it
// ranked was lost meanwhile.
func (p *Picker) rankAndAcquire(req *lb.Request, st *settings, facts RequestFacts, lru bool, now time.Time, list *[]string) (lb.Lease, error) {
	addrs := *list
	cutoff := now.Add(-st.requestTimeout)
	var onStack [smallPool]Candidate
	cands := onStack[:0]
	if len(addrs) > smallPool {
		cands = make([]Candidate, 0, len(addrs))
	}
	for _, addr := range addrs {
		if req.Excluded(addr) {
			continue
		}
		v, ok := p.tracker.View(addr, cutoff)
		if !ok || !v.Usable {
			continue
		}
		c := Candidate{Addr: addr, Active: v.Active, ActiveTokens: v.ActiveCost, LastPick: v.LastAcquired, Pace: v.Pace}
		if lru {
			c.LastCold = p.policy.LastCold(addr)
		}
		s, fresh := p.scraper.Get(addr)
		c.MetricsUnknown = fresh == modelmetrics.Unknown
		if fresh == modelmetrics.Fresh && s.Have.Waiting {
			c.Waiting, c.MetricsFresh = s.Waiting, true
			c.Running = s.Running // 0 when not exported: never even
			c.KVCacheUsage = 1    // not exported: no credit for free cache
			if s.Have.KVCache {
				c.KVCacheUsage = s.KVCacheUsage
			}
		}
		cands = append(cands, c)
	}
	if len(cands) == 0 {
		if p.addrs.Load() != list {
			return nil, nil // a set-backends landed meanwhile: rank its set
		}
		if len(addrs) > 0 {
			return nil, lb.ErrAllDown
		}
		return nil, lb.ErrNoBackends
	}
	explain := p.explaining()
	var rankBuf [2 * smallPool]float64
	var orderBuf [smallPool]int
	order, total, scores := st.rank(cands, facts, explain, rankBuf[:0], orderBuf[:0])
	if explain {
		// Copies: cands and the ranking may be on this call's stack.
		p.Explain(Explanation{Picked: cands[order[0]].Addr, Hot: facts.Hot, Session: facts.SessionAddr,
			Shift: st.shift, Candidates: slices.Clone(cands),
			Rank: Ranking{Order: slices.Clone(order), Total: slices.Clone(total), Scores: scores}})
	}
	for k, i := range order {
		addr := cands[i].Addr
		l := p.tracker.AcquireUsable(addr, req.Tokens)
		if l == nil {
			continue // removed meanwhile, or its one probe taken
		}
		if k+1 < len(order) {
			m := &fallbackMemo{}
			rest := m.small[:0]
			if n := len(order) - k - 1; n > len(m.small) {
				rest = make([]string, 0, n)
			}
			for _, j := range order[k+1:] {
				rest = append(rest, cands[j].Addr)
			}
			m.order = rest
			req.Memo = m
		} else {
			req.Memo = nil // no fallback: a retry ranks afresh
		}
		if lru {
			if !facts.Hot {
				p.policy.NoteCold(addr, now)
			}
			if req.Parsed && req.Text != "" {
				p.prefixes.Insert(req.Model, req.Text, addr)
			}
		}
		req.Reason = lb.ReasonScore
		return p.lease(l, st.slo), nil
	}
	return nil, nil
}

func (p *Picker) sessionAddr(token string) string {
	if token == "" {
		return ""
	}
	return (*p.tokens.Load())[token]
}

// lease wraps l to feed adaptive mode; without an SLO nothing is fed, so
// the tracker's lease goes as it is.
func (p *Picker) lease(l *tracker.Lease, slo time.Duration) lb.Lease {
	if slo == 0 {
		return l
	}
	return &ttftLease{Lease: l, policy: p.policy}
}

// ttftLease feeds adaptive mode with each streamed success's time to
// first byte. An outcome not marked Streamed carries a time to last byte,
// and a non-streamed answer's first byte comes only when the generation
// is done: either would read seconds of healthy generation as a slow
// first token and move weight off the affinity scorers, so neither is
// fed.
type ttftLease struct {
	*tracker.Lease
	policy *Policy
}

func (l *ttftLease) Release(out lb.Outcome) bool {
	if !l.Lease.Release(out) {
		return false
	}
	if out.Kind == lb.Success && out.Streamed {
		l.policy.ObserveTTFT(out.Latency)
	}
	return true
}

var _ lb.Picker = (*Picker)(nil)
