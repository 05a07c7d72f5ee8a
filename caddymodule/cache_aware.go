package caddymodule

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/tracker"
)

func init() {
	caddy.RegisterModule(CacheAware{})
}

// CacheAware is SGLang's cache-aware router as a selection policy: per
// model, an approximate radix tree of the prompts each replica served
// recently; a request goes to the replica holding the longest prefix of
// its prompt, unless the pool is imbalanced, then to the least loaded.
// The trees and in-flight counts belong to the pool and survive reloads.
type CacheAware struct {
	Pool string `json:"pool,omitempty"`
	// Match rate (matched / prompt characters) above which the best
	// matching replica is used (default 0.5; a negative value means 0).
	CacheThreshold float64 `json:"cache_threshold,omitempty"`
	// Imbalance: max-min in-flight above BalanceAbsThreshold (default 32;
	// negative means 0) and max above BalanceRelThreshold × min (default 1.0001).
	BalanceAbsThreshold int     `json:"balance_abs_threshold,omitempty"`
	BalanceRelThreshold float64 `json:"balance_rel_threshold,omitempty"`
	// Bound on the trees, in characters (Unicode code points) of stored
	// text across all replicas and models of the pool (default 16777216).
	MaxTreeSize int `json:"max_tree_size,omitempty"`
	// Period of the background trim to 7/8 of the bound (default 60s).
	EvictionInterval caddy.Duration `json:"eviction_interval,omitempty"`
	// On a miss: least_load (default) or smallest_tree (the original seed).
	MissPolicy string `json:"miss_policy,omitempty"`
	// Bytes of request body buffered to read the prompt (default 4 MiB).
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// Passive health: consecutive failures that mark a replica down
	// (default 1) and for how long (default 5s, doubling up to 16×).
	MaxFails     int            `json:"max_fails,omitempty"`
	FailDuration caddy.Duration `json:"fail_duration,omitempty"`

	state  *cacheAwareState
	pool   *lb.Pool
	varKey string
	log    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (CacheAware) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.cache_aware",
		New: func() caddy.Module { return new(CacheAware) },
	}
}

func (p *CacheAware) routerConfig() cacheaware.Config {
	return cacheaware.Config{
		CacheThreshold:      p.CacheThreshold,
		BalanceAbsThreshold: p.BalanceAbsThreshold,
		BalanceRelThreshold: p.BalanceRelThreshold,
		MaxTreeSize:         p.MaxTreeSize,
		EvictionInterval:    time.Duration(p.EvictionInterval),
		MissPolicy:          p.MissPolicy,
	}
}

func (p *CacheAware) trackerConfig() tracker.Config {
	return tracker.Config{MaxFails: p.MaxFails, FailDuration: time.Duration(p.FailDuration)}
}

// Validate implements caddy.Validator.
func (p *CacheAware) Validate() error {
	if err := validatePoolName(poolName(p.Pool)); err != nil {
		return fmt.Errorf("cache_aware: %v", err)
	}
	if err := p.routerConfig().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("cache_aware: %v", err)
	}
	switch {
	case p.MaxBodyBytes < 0:
		return fmt.Errorf("cache_aware: max_body_bytes must be positive, got %d", p.MaxBodyBytes)
	case p.MaxFails < 0:
		return fmt.Errorf("cache_aware: max_fails must be >= 1, got %d", p.MaxFails)
	case p.FailDuration < 0:
		return fmt.Errorf("cache_aware: fail_duration must be positive, got %s", time.Duration(p.FailDuration))
	}
	return nil
}

// Provision implements caddy.Provisioner.
func (p *CacheAware) Provision(ctx caddy.Context) error {
	p.log = ctx.Logger()
	if err := p.Validate(); err != nil {
		return err
	}
	if p.MaxBodyBytes == 0 {
		p.MaxBodyBytes = DefaultMaxBodyBytes
	}
	name := poolName(p.Pool)
	restorePool(name, p.log)
	p.pool = lb.GetPool(name)
	p.varKey = "sluice.cache_aware." + name
	val, _, err := cacheAwareStates.LoadOrNew(name, func() (caddy.Destructor, error) {
		return newCacheAwareState(name, p.routerConfig(), p.trackerConfig()), nil
	})
	if err != nil {
		return err
	}
	p.state = val.(*cacheAwareState)
	p.state.router.Configure(p.routerConfig())
	p.state.tracker.Configure(p.trackerConfig())
	registerMetrics(ctx, p.log)
	return nil
}

// Cleanup implements caddy.CleanerUpper.
func (p *CacheAware) Cleanup() error {
	_, err := cacheAwareStates.Delete(poolName(p.Pool))
	return err
}

// Select implements reverseproxy.Selector.
func (p *CacheAware) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	a := startAttempt(r, p.varKey, measureAuto)
	if a == nil {
		return nil
	}
	if !p.pool.Managed() {
		p.state.syncStatic(pool)
	}
	ri := requestInfoFor(r, p.MaxBodyBytes)
	st := p.state
	for tries := 0; tries < 3; tries++ {
		d := st.router.Pick(ri.Model, ri.Text, st.tracker.Load)
		if d.Addr == "" {
			err := lb.ErrNoBackends
			if d.Reason == cacheaware.NoUsable {
				err = lb.ErrAllDown
			}
			rf, _ := refusalFor(err, time.Second)
			a.refuse(r, w, rf)
			return nil
		}
		lease := st.tracker.Acquire(d.Addr)
		if lease == nil {
			continue // removed between pick and acquire: pick again
		}
		if ri.Parsed && ri.Text != "" {
			st.router.Insert(ri.Model, ri.Text, d.Addr)
		}
		if c := p.log.Check(zap.DebugLevel, "cache_aware pick"); c != nil {
			c.Write(zap.String("pool", p.pool.Name()), zap.String("addr", d.Addr), zap.Stringer("reason", d.Reason),
				zap.Float64("match_rate", d.MatchRate), zap.Int("matched_chars", d.MatchedChars), zap.String("model", ri.Model))
		}
		if !a.begin(lease) {
			return nil
		}
		return upstreamFor(pool, d.Addr)
	}
	rf, _ := refusalFor(lb.ErrNoBackends, time.Second)
	a.refuse(r, w, rf)
	return nil
}

// cacheAwareStates: one router + tracker per pool, kept across reloads.
var cacheAwareStates = caddy.NewUsagePool()

type cacheAwareState struct {
	router  *cacheaware.Router
	tracker *tracker.Tracker
	unwatch func()
	stop    context.CancelFunc
	done    chan struct{}

	static staticSync
}

func newCacheAwareState(name string, rc cacheaware.Config, tc tracker.Config) *cacheAwareState {
	st := &cacheAwareState{router: cacheaware.New(rc), tracker: tracker.New(tc), done: make(chan struct{})}
	st.unwatch = lb.GetPool(name).Watch(func(set []lb.Backend, managed bool) {
		if managed {
			st.setReplicas(lb.Dials(set))
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	st.stop = cancel
	go func() {
		defer close(st.done)
		st.router.Run(ctx)
	}()
	return st
}

func (st *cacheAwareState) setReplicas(addrs []string) {
	st.tracker.SetReplicas(addrs)
	st.router.SetReplicas(addrs)
}

func (st *cacheAwareState) syncStatic(pool reverseproxy.UpstreamPool) {
	st.static.sync(pool, func(set []lb.Backend) { st.setReplicas(lb.Dials(set)) })
}

// Destruct implements caddy.Destructor: stops the eviction loop.
func (st *cacheAwareState) Destruct() error {
	st.unwatch()
	st.stop()
	<-st.done
	return nil
}

// cacheAwareStateFor returns a pool's live state without taking a
// reference, or nil.
func cacheAwareStateFor(name string) *cacheAwareState {
	st, _ := usageLookup(cacheAwareStates, name).(*cacheAwareState)
	return st
}

func cacheAwareRouters() map[string]*cacheaware.Router {
	return usageByPool(cacheAwareStates, func(v any) *cacheaware.Router { return v.(*cacheAwareState).router })
}

// UnmarshalCaddyfile sets up the policy from:
//
//	lb_policy cache_aware {
//	    pool                  <name>
//	    cache_threshold       <0..1>
//	    balance_abs_threshold <n>
//	    balance_rel_threshold <float>
//	    max_tree_size         <characters>
//	    eviction_interval     <duration|seconds>
//	    miss_policy           least_load|smallest_tree
//	    max_body_bytes        <bytes>
//	    max_fails             <n>
//	    fail_duration         <duration|seconds>
//	}
func (p *CacheAware) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseOptionBlock(d, "cache_aware", func(opt, val string) (err error) {
		switch opt {
		case "pool":
			p.Pool = val
		case "cache_threshold":
			p.CacheThreshold, err = parseUnitFloat(val)
			if err == nil && p.CacheThreshold == 0 {
				p.CacheThreshold = -1 // explicit 0, not "default"
			}
		case "balance_abs_threshold":
			p.BalanceAbsThreshold, err = atLeast(val, 0)
			if err == nil && p.BalanceAbsThreshold == 0 {
				p.BalanceAbsThreshold = -1 // explicit 0, not "default"
			}
		case "balance_rel_threshold":
			p.BalanceRelThreshold, err = strconv.ParseFloat(val, 64)
			if err == nil && (math.IsNaN(p.BalanceRelThreshold) || math.IsInf(p.BalanceRelThreshold, 0) || p.BalanceRelThreshold < 1) {
				err = fmt.Errorf("must be a number >= 1")
			}
		case "max_tree_size":
			p.MaxTreeSize, err = atLeast(val, 1)
		case "eviction_interval":
			p.EvictionInterval, err = parseSecondsOrDuration(val)
			if err == nil && p.EvictionInterval <= 0 {
				err = fmt.Errorf("must be positive")
			}
		case "miss_policy":
			p.MissPolicy = val
			if val != cacheaware.MissLeastLoad && val != cacheaware.MissSmallestTree {
				err = fmt.Errorf("must be %s or %s", cacheaware.MissLeastLoad, cacheaware.MissSmallestTree)
			}
		case "max_body_bytes":
			var n int
			n, err = atLeast(val, 1)
			p.MaxBodyBytes = int64(n)
		case "max_fails":
			p.MaxFails, err = atLeast(val, 1)
		case "fail_duration":
			p.FailDuration, err = parseSecondsOrDuration(val)
		default:
			return errUnknownOption
		}
		return err
	})
}

// Interface guards
var (
	_ caddy.Provisioner     = (*CacheAware)(nil)
	_ caddy.Validator       = (*CacheAware)(nil)
	_ caddy.CleanerUpper    = (*CacheAware)(nil)
	_ reverseproxy.Selector = (*CacheAware)(nil)
	_ caddyfile.Unmarshaler = (*CacheAware)(nil)
	_ caddy.Destructor      = (*cacheAwareState)(nil)
)
