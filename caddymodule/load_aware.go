package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/loadaware"
	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/tracker"
)

func init() {
	caddy.RegisterModule(LoadAware{})
}

// LoadAware is Heimdall's load-aware routing as a selection policy:
// weighted scorers rate each replica (higher = lighter), the max-score
// picker takes the best and keeps the runners-up for retries.
type LoadAware struct {
	Pool string `json:"pool,omitempty"`
	// Scorers maps scorer name → weight (queue, load_aware,
	// active_request, session_affinity, no_hit_lru, kv_cache, and Sluice's
	// active_tokens). Empty: the five Heimdall scorers at weight 1.
	Scorers map[string]float64 `json:"scorers,omitempty"`
	// load_aware scorer threshold (default 128 waiting requests).
	Threshold float64 `json:"threshold,omitempty"`
	// active_request: requests older than this stop counting (default 2m).
	RequestTimeout caddy.Duration `json:"request_timeout,omitempty"`
	// no_hit_lru: replicas tracked (default 1024), and the shared prefix
	// length that makes a request hot (default 64 characters).
	LRUSize        int `json:"lru_size,omitempty"`
	HotPrefixChars int `json:"hot_prefix_chars,omitempty"`
	// Picker: endpoints returned, the extras being the retry order (default 1).
	MaxNumEndpoints int `json:"max_num_endpoints,omitempty"`
	// Adaptive mode: time-to-first-byte SLO (0: off) and the weight shift
	// per completed request (default 0.05).
	SLO          caddy.Duration `json:"slo,omitempty"`
	AdaptiveStep float64        `json:"adaptive_step,omitempty"`
	// Replica metrics scraping (queue, load_aware, kv_cache scorers).
	MetricsInterval  caddy.Duration `json:"metrics_interval,omitempty"`
	MetricsStaleness caddy.Duration `json:"metrics_staleness,omitempty"`
	MetricsPath      string         `json:"metrics_path,omitempty"`
	// Session header carrying the affinity token (default X-Session-Token).
	SessionHeader string `json:"session_header,omitempty"`
	// Body buffered to read the prompt (default 4 MiB).
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// Passive health, as for the other policies.
	MaxFails     int            `json:"max_fails,omitempty"`
	FailDuration caddy.Duration `json:"fail_duration,omitempty"`

	state  *loadAwareState
	pool   *lb.Pool
	varKey string
	log    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (LoadAware) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.load_aware",
		New: func() caddy.Module { return new(LoadAware) },
	}
}

func (p *LoadAware) policyConfig() loadaware.Config {
	var w map[string]float64
	if len(p.Scorers) > 0 {
		w = p.Scorers
	}
	return loadaware.Config{
		Weights: w, Threshold: p.Threshold, RequestTimeout: time.Duration(p.RequestTimeout),
		LRUSize: p.LRUSize, MaxNumEndpoints: p.MaxNumEndpoints, HotPrefixChars: p.HotPrefixChars,
		SLO: time.Duration(p.SLO), AdaptiveStep: p.AdaptiveStep,
	}
}

func (p *LoadAware) scraperConfig() modelmetrics.Config {
	return modelmetrics.Config{Interval: time.Duration(p.MetricsInterval), Staleness: time.Duration(p.MetricsStaleness), Path: p.MetricsPath}
}

// Validate implements caddy.Validator.
func (p *LoadAware) Validate() error {
	if err := validatePoolName(poolName(p.Pool)); err != nil {
		return fmt.Errorf("load_aware: %v", err)
	}
	if err := p.policyConfig().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("load_aware: %v", err)
	}
	if err := p.scraperConfig().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("load_aware: %v", err)
	}
	if p.MaxBodyBytes < 0 || p.MaxFails < 0 || p.FailDuration < 0 {
		return fmt.Errorf("load_aware: max_body_bytes, max_fails and fail_duration must be positive")
	}
	return nil
}

// Provision implements caddy.Provisioner.
func (p *LoadAware) Provision(ctx caddy.Context) error {
	p.log = ctx.Logger()
	if err := p.Validate(); err != nil {
		return err
	}
	if p.MaxBodyBytes == 0 {
		p.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if p.SessionHeader == "" {
		p.SessionHeader = "X-Session-Token"
	}
	name := poolName(p.Pool)
	restorePool(name, p.log)
	p.pool = lb.GetPool(name)
	p.varKey = "sluice.load_aware." + name
	val, _, err := loadAwareStates.LoadOrNew(name, func() (caddy.Destructor, error) {
		return newLoadAwareState(name, p.policyConfig(), p.scraperConfig(), tracker.Config{MaxFails: p.MaxFails, FailDuration: time.Duration(p.FailDuration)}), nil
	})
	if err != nil {
		return err
	}
	p.state = val.(*loadAwareState)
	p.state.policy.Configure(p.policyConfig())
	p.state.tracker.Configure(tracker.Config{MaxFails: p.MaxFails, FailDuration: time.Duration(p.FailDuration)})
	registerMetrics(ctx, p.log)
	return nil
}

// Cleanup implements caddy.CleanerUpper.
func (p *LoadAware) Cleanup() error {
	_, err := loadAwareStates.Delete(poolName(p.Pool))
	return err
}

// fallbackVar holds a request's remaining fallback order across retries.
const fallbackVar = "sluice.load_aware.fallback"

// Select implements reverseproxy.Selector.
func (p *LoadAware) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	a := startAttempt(r, p.varKey, measureFirstByte)
	if a == nil {
		return nil
	}
	st := p.state
	if !p.pool.Managed() {
		st.syncStatic(pool)
	}
	now := time.Now()
	// A retry takes the next usable endpoint of the first pick's order.
	if fb, ok := caddyhttp.GetVar(r.Context(), fallbackVar).([]string); ok {
		for len(fb) > 0 {
			addr := fb[0]
			fb = fb[1:]
			caddyhttp.SetVar(r.Context(), fallbackVar, fb)
			if _, usable := st.tracker.Load(addr); usable {
				if l := st.tracker.AcquireCost(addr, requestInfoFor(r, p.MaxBodyBytes).estimatedTokens()); l != nil {
					return p.dispatch(a, pool, w, l, addr)
				}
			}
		}
	}

	// Read the body (it may still be arriving) before looking at the
	// replicas: the counts must be as fresh as possible when ranked, or a
	// burst of concurrent picks all rank the same stale zeros and pile onto
	// one replica.
	cfg := st.policy.Config()
	ri := requestInfoFor(r, p.MaxBodyBytes)
	facts := loadaware.RequestFacts{SessionAddr: st.sessionAddr(r.Header.Get(p.SessionHeader))}
	if ri.Parsed && ri.Text != "" {
		d := st.prefixes.Pick(ri.Model, ri.Text, nil)
		facts.Hot = d.MatchedChars >= cfg.HotPrefixChars
	}
	now = time.Now()
	addrs := *st.addrs.Load()
	cutoff := now.Add(-cfg.RequestTimeout)
	cands := make([]loadaware.Candidate, 0, len(addrs))
	for _, addr := range addrs {
		if _, usable := st.tracker.Load(addr); !usable {
			continue
		}
		c := loadaware.Candidate{Addr: addr, LastCold: st.policy.LastCold(addr)}
		c.Active, c.ActiveTokens = st.tracker.Active(addr, cutoff)
		s, fresh := st.scraper.Get(addr)
		c.MetricsUnknown = fresh == modelmetrics.Unknown
		if fresh == modelmetrics.Fresh && s.Have.Waiting {
			c.Waiting, c.MetricsFresh = s.Waiting, true
			c.KVCacheUsage = 1 // not exported: no credit for free cache
			if s.Have.KVCache {
				c.KVCacheUsage = s.KVCacheUsage
			}
		}
		cands = append(cands, c)
	}
	if len(cands) == 0 {
		err := lb.ErrNoBackends
		if len(addrs) > 0 {
			err = lb.ErrAllDown
		}
		rf, _ := refusalFor(err, time.Second)
		a.refuse(r, w, rf)
		return nil
	}

	rank := st.policy.Rank(cands, facts)
	if c := p.log.Check(zap.DebugLevel, "load_aware scores"); c != nil {
		fields := []zap.Field{zap.String("pool", p.pool.Name()), zap.String("picked", cands[rank.Order[0]].Addr),
			zap.Bool("hot", facts.Hot), zap.String("session", facts.SessionAddr), zap.Float64("adaptive_shift", st.policy.Shift())}
		for i, cand := range cands {
			var b strings.Builder
			fmt.Fprintf(&b, "total=%.3f", rank.Total[i])
			for _, name := range loadaware.AllScorers {
				if s, ok := rank.Scores[name]; ok {
					fmt.Fprintf(&b, " %s=%.3f", name, s[i])
				}
			}
			fields = append(fields, zap.String(cand.Addr, b.String()))
		}
		c.Write(fields...)
	}
	cost := ri.estimatedTokens()
	for k, i := range rank.Order {
		addr := cands[i].Addr
		l := st.tracker.AcquireCost(addr, cost)
		if l == nil {
			continue
		}
		rest := make([]string, 0, len(rank.Order)-k-1)
		for _, j := range rank.Order[k+1:] {
			rest = append(rest, cands[j].Addr)
		}
		caddyhttp.SetVar(r.Context(), fallbackVar, rest)
		if !facts.Hot {
			st.policy.NoteCold(addr, now)
		}
		if ri.Parsed && ri.Text != "" {
			st.prefixes.Insert(ri.Model, ri.Text, addr)
		}
		return p.dispatch(a, pool, w, l, addr)
	}
	rf, _ := refusalFor(lb.ErrNoBackends, time.Second)
	a.refuse(r, w, rf)
	return nil
}

// dispatch records the attempt and hands the session token back.
func (p *LoadAware) dispatch(a *attempt, pool reverseproxy.UpstreamPool, w http.ResponseWriter, l *tracker.Lease, addr string) *reverseproxy.Upstream {
	if !a.begin(ttftObserver{l, p.state.policy}) {
		return nil
	}
	w.Header().Set(p.SessionHeader, sessionToken(addr))
	return upstreamFor(pool, addr)
}

// ttftObserver feeds adaptive mode with each success's time to first byte.
type ttftObserver struct {
	*tracker.Lease
	policy *loadaware.Policy
}

func (o ttftObserver) Release(out lb.Outcome) bool {
	if !o.Lease.Release(out) {
		return false
	}
	if out.Kind == lb.Success {
		o.policy.ObserveTTFT(out.Latency)
	}
	return true
}

// sessionToken is the opaque, stable token for a replica: a hash, so it
// reveals no address, survives restarts and is the same on every Sluice
// instance in front of the pool.
func sessionToken(addr string) string {
	sum := sha256.Sum256([]byte("sluice-session:" + addr))
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

var loadAwareStates = caddy.NewUsagePool()

// loadAwareScrapers lists every live scraper by pool, for metrics.
func loadAwareScrapers() map[string]*modelmetrics.Scraper {
	return usageByPool(loadAwareStates, func(v any) *modelmetrics.Scraper { return v.(*loadAwareState).scraper })
}

// scraperFor returns the replica-metrics scraper of a pool served by
// load_aware, or nil.
func scraperFor(name string) *modelmetrics.Scraper {
	if st, ok := usageLookup(loadAwareStates, name).(*loadAwareState); ok {
		return st.scraper
	}
	return nil
}

// trackerFor returns the in-flight tracker of a pool served by cache_aware
// or load_aware, or nil.
func trackerFor(name string) *tracker.Tracker {
	if st := cacheAwareStateFor(name); st != nil {
		return st.tracker
	}
	if st, ok := usageLookup(loadAwareStates, name).(*loadAwareState); ok {
		return st.tracker
	}
	return nil
}

type loadAwareState struct {
	policy   *loadaware.Policy
	tracker  *tracker.Tracker
	scraper  *modelmetrics.Scraper
	prefixes *cacheaware.Router // which prompts' prefixes were routed already: hot or cold
	addrs    atomic.Pointer[[]string]
	tokens   atomic.Pointer[map[string]string] // session token → addr
	unwatch  func()
	stop     context.CancelFunc
	wg       sync.WaitGroup

	static staticSync
}

func newLoadAwareState(name string, pc loadaware.Config, sc modelmetrics.Config, tc tracker.Config) *loadAwareState {
	st := &loadAwareState{
		policy:   loadaware.New(pc),
		tracker:  tracker.New(tc),
		scraper:  modelmetrics.New(sc),
		prefixes: cacheaware.New(cacheaware.Config{MaxTreeSize: 4 << 20}),
	}
	empty := []string{}
	st.addrs.Store(&empty)
	tokens := map[string]string{}
	st.tokens.Store(&tokens)
	ctx, cancel := context.WithCancel(context.Background())
	st.stop = cancel
	st.wg.Add(2)
	go func() { defer st.wg.Done(); st.scraper.Run(ctx) }()
	go func() { defer st.wg.Done(); st.prefixes.Run(ctx) }()
	st.unwatch = lb.GetPool(name).Watch(func(set []lb.Backend, managed bool) {
		if managed {
			st.setReplicas(set)
		}
	})
	return st
}

func (st *loadAwareState) setReplicas(set []lb.Backend) {
	addrs := lb.Dials(set)
	targets := make(map[string]string, len(set))
	tokens := make(map[string]string, len(set))
	keep := make(map[string]bool, len(set))
	for _, b := range set {
		targets[b.Dial] = b.URL
		tokens[sessionToken(b.Dial)] = b.Dial
		keep[b.Dial] = true
	}
	st.tracker.SetReplicas(addrs)
	st.prefixes.SetReplicas(addrs)
	st.policy.Forget(keep)
	st.scraper.SetTargets(targets)
	st.tokens.Store(&tokens)
	st.addrs.Store(&addrs)
}

func (st *loadAwareState) sessionAddr(token string) string {
	if token == "" {
		return ""
	}
	return (*st.tokens.Load())[token]
}

func (st *loadAwareState) syncStatic(pool reverseproxy.UpstreamPool) {
	st.static.sync(pool, st.setReplicas)
}

// Destruct implements caddy.Destructor: stops the scraper and eviction.
func (st *loadAwareState) Destruct() error {
	st.unwatch()
	st.stop()
	st.wg.Wait()
	return nil
}

// UnmarshalCaddyfile sets up the policy from:
//
//	lb_policy load_aware {
//	    pool              <name>
//	    scorer            <name> [<weight>]   # repeatable; none: the five Heimdall scorers at 1
//	    threshold         <waiting requests>
//	    request_timeout   <duration|seconds>
//	    lru_size          <n>
//	    hot_prefix_chars  <n>
//	    max_num_endpoints <n>
//	    slo               <duration|seconds>  # adaptive mode
//	    adaptive_step     <0..1>
//	    metrics_interval  <duration|seconds>
//	    metrics_staleness <duration|seconds>
//	    metrics_path      <path>
//	    session_header    <header>
//	    max_body_bytes    <bytes>
//	    max_fails         <n>
//	    fail_duration     <duration|seconds>
//	}
func (p *LoadAware) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		return d.Errf("load_aware: takes no arguments, only a block; got %q", d.Val())
	}
	for d.NextBlock(0) {
		opt := d.Val()
		args := d.RemainingArgs()
		if opt == "scorer" {
			if len(args) < 1 || len(args) > 2 {
				return d.Errf("load_aware: scorer takes a name and an optional weight")
			}
			weight := 1.0
			if len(args) == 2 {
				var err error
				weight, err = strconv.ParseFloat(args[1], 64)
				if err != nil || math.IsNaN(weight) || math.IsInf(weight, 0) || weight < 0 {
					return d.Errf("load_aware: scorer %s: bad weight %q", args[0], args[1])
				}
			}
			if p.Scorers == nil {
				p.Scorers = map[string]float64{}
			}
			p.Scorers[args[0]] = weight
			continue
		}
		if len(args) != 1 {
			return d.Errf("load_aware: %s takes one value", opt)
		}
		val := args[0]
		var err error
		switch opt {
		case "pool":
			p.Pool = val
		case "threshold":
			p.Threshold, err = strconv.ParseFloat(val, 64)
			if err == nil && !(p.Threshold >= 1) {
				err = fmt.Errorf("must be >= 1")
			}
		case "request_timeout":
			p.RequestTimeout, err = parseSecondsOrDuration(val)
		case "lru_size":
			p.LRUSize, err = atLeast(val, 1)
		case "hot_prefix_chars":
			p.HotPrefixChars, err = atLeast(val, 1)
		case "max_num_endpoints":
			p.MaxNumEndpoints, err = atLeast(val, 1)
		case "slo":
			p.SLO, err = parseSecondsOrDuration(val)
		case "adaptive_step":
			p.AdaptiveStep, err = strconv.ParseFloat(val, 64)
			if err == nil && !(p.AdaptiveStep > 0 && p.AdaptiveStep <= 1) {
				err = fmt.Errorf("must be in (0, 1]")
			}
		case "metrics_interval":
			p.MetricsInterval, err = parseSecondsOrDuration(val)
		case "metrics_staleness":
			p.MetricsStaleness, err = parseSecondsOrDuration(val)
		case "metrics_path":
			p.MetricsPath = val
		case "session_header":
			p.SessionHeader = val
		case "max_body_bytes":
			var n int
			n, err = atLeast(val, 1)
			p.MaxBodyBytes = int64(n)
		case "max_fails":
			p.MaxFails, err = atLeast(val, 1)
		case "fail_duration":
			p.FailDuration, err = parseSecondsOrDuration(val)
		default:
			return d.Errf("load_aware: unknown option %q", opt)
		}
		if err != nil {
			return d.Errf("load_aware: bad %s %q: %v", opt, val, err)
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*LoadAware)(nil)
	_ caddy.Validator       = (*LoadAware)(nil)
	_ caddy.CleanerUpper    = (*LoadAware)(nil)
	_ reverseproxy.Selector = (*LoadAware)(nil)
	_ caddyfile.Unmarshaler = (*LoadAware)(nil)
	_ caddy.Destructor      = (*loadAwareState)(nil)
)
