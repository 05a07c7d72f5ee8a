package caddymodule

import (
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/cacheaware/share"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/tracker"
)

func init() {
	caddy.RegisterModule(CacheAware{})
	registerCollectors(cacheAwareCollector, cacheShareCollector)
}

var _ policyModule = (*CacheAware)(nil)

// Collectors of every live cache_aware state: its trees, and the sharing
// of the trees through Redis.
var (
	cacheAwareCollector = cacheaware.NewCollector(func() map[string]*cacheaware.Router {
		return mapped(pickersOf[*cacheaware.Picker]("cache_aware"), (*cacheaware.Picker).Router)
	})
	cacheShareCollector = share.NewCollector(func() map[string]*share.Sharer {
		out := map[string]*share.Sharer{}
		for pool, st := range liveStates("cache_aware") {
			if sh, ok := st.(*policyState).extra.(*share.Sharer); ok {
				out[pool] = sh
			}
		}
		return out
	})
)

// CacheAware is SGLang's cache-aware router as a selection policy: per
// model, an approximate radix tree of the prompts each replica served
// recently; a request goes to the replica holding the longest prefix of
// its prompt, unless the pool is imbalanced, then to the least loaded.
// The trees and in-flight counts belong to the pool and survive reloads.
type CacheAware struct {
	Pool string `json:"pool,omitempty"`
	// Match rate (matched / prompt characters) above which the best
	// matching replica is used (default 0.5; a negative value means 0).
	CacheThreshold float64 `json:"cache_threshold,omitempty" sluice:"min=0"`
	// Imbalance: max-min in-flight above BalanceAbsThreshold (default 32;
	// negative means 0) and max above BalanceRelThreshold × min (default 1.0001).
	BalanceAbsThreshold int     `json:"balance_abs_threshold,omitempty" sluice:"min=0"`
	BalanceRelThreshold float64 `json:"balance_rel_threshold,omitempty" sluice:"min=1"`
	// Bound on the trees, in characters (Unicode code points) of stored
	// text across all replicas and models of the pool (default 16777216).
	MaxTreeSize int `json:"max_tree_size,omitempty" sluice:"min=1"`
	// Period of the background trim to 7/8 of the bound (default 60s).
	EvictionInterval caddy.Duration `json:"eviction_interval,omitempty" sluice:"positive"`
	// On a miss: least_load (default) or smallest_tree (the original seed).
	MissPolicy string `json:"miss_policy,omitempty"`
	// With redis set, the instances using this pool through the same
	// Redis share their trees: each publishes the prompts it routed on a
	// Redis stream and applies the others' (lb/cacheaware/share); the pick
	// stays local. Without it, each instance has its own tree.
	redisConnection
	// kv_events: the exact index from engine KV events (see kvEventsOptions).
	kvEventsOptions
	bodyOptions
	passiveHealth
	attemptOptions
	selector
}

// CaddyModule returns the Caddy module information.
func (CacheAware) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("http.reverse_proxy.selection_policies.cache_aware", func() caddy.Module { return new(CacheAware) })
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
	return p.passiveHealth.trackerConfig()
}

// Validate implements caddy.Validator.
func (p *CacheAware) Validate() error {
	if err := validatePoolName(poolName(p.Pool)); err != nil {
		return fmt.Errorf("cache_aware: %v", err)
	}
	if err := p.routerConfig().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("cache_aware: %v", err)
	}
	if p.shared() {
		if err := p.conn().WithDefaults().Validate(); err != nil {
			return fmt.Errorf("cache_aware: %v", err)
		}
	}
	if err := p.kvEventsOptions.validate(); err != nil {
		return fmt.Errorf("cache_aware: %v", err)
	}
	return validateBodyAndHealth("cache_aware", p.bodyOptions, p.passiveHealth)
}

// shared reports whether the tree is shared through Redis.
func (p *CacheAware) shared() bool { return len(p.Redis) > 0 }

// connectionKey tells apart the Redis connections trees are shared
// through ("" for a local tree): the state (tree, counts, stream reader)
// is kept across reloads only while it stays the same.
func connectionKey(c redisconn.Config) string { return redisconn.FieldsKey(c.Fields()) }

// shareKey is a shared tree's connection key with its read timeout: the
// sharer's connection is built with it, so a reload that changes it
// builds a new sharer (whose tree replays the stream).
func shareKey(c redisconn.Config) string {
	return redisconn.FieldsKey(append(c.Fields(), [2]string{"read_timeout", c.ReadTimeout.String()}))
}

// CacheAwareSettings is what health shows: the picker's settings and, for
// a shared tree, the sharing's state and counters.
type CacheAwareSettings struct {
	cacheaware.PickerSettings
	Redis    *redisconn.Config `json:"redis,omitempty"`
	Share    *share.Stats      `json:"share,omitempty"`
	KVEvents *KVEventsStats    `json:"kv_events,omitempty"`
}

// CacheAwareShareStats are the sharing stats of every live cache_aware
// state of pool that shares its tree (one per Redis connection).
func CacheAwareShareStats(pool string) []share.Stats {
	var out []share.Stats
	for _, r := range sharedStates.visible() {
		if r.key.module == "cache_aware" && r.key.pool == pool {
			if sh, ok := r.st.(*policyState).extra.(*share.Sharer); ok {
				out = append(out, sh.Stats())
			}
		}
	}
	return out
}

// Provision implements caddy.Provisioner.
func (p *CacheAware) Provision(ctx caddy.Context) error {
	if err := p.Validate(); err != nil {
		return err
	}
	rc, tc := p.routerConfig(), p.trackerConfig()
	pool := poolName(p.Pool)
	variant, conn := "", p.conn().WithDefaults()
	if p.shared() {
		variant = shareKey(conn)
	}
	kv := p.kvEventsOptions
	if v := kv.variant(); v != "" {
		variant = strings.TrimPrefix(variant+";"+v, ";")
	}
	return p.provision(ctx, selectorSpec{
		attempt: p.attemptOptions,
		module:  "cache_aware", pool: pool, variant: variant, measure: measureAuto,
		maxBody:     p.bodyLimit(),
		fingerprint: fmt.Sprintf("%+v %+v %s", rc, tc, variant),
		build: func(key stateKey) (*policyState, error) {
			pk := cacheaware.NewPicker(rc, tc)
			pk.Router().SeedTurns(rand.Uint64()) // instances must not take turns in lockstep
			health := func() stateHealth { return trackerHealth(pk.Tracker()) }
			var closers []func()
			var kvStats func() *KVEventsStats
			run := pk.Run
			var capacity *kvCapacity
			var setTLS func(*tls.Config)
			if kv.enabled() {
				c := newKVCapacity()
				capacity, run = &c, c.run(pk.Run)
				var relayConn *redisconn.Config
				if p.shared() {
					relayConn = &conn
				}
				// it sets c as pk's capacity source, through which the
				// index follows pk's replica set
				release, stats, tls, err := attachKVEvents(pool, kv, pk, c, relayConn)
				if err != nil {
					return nil, err
				}
				closers, kvStats, setTLS = append(closers, release), stats, tls
			}
			var sh *share.Sharer
			if p.shared() {
				sh = share.New(share.Config{Conn: conn, Pool: pool}, pk.PeerRouted)
				pk.OnInsert(sh.Publish)
				closers = append(closers, sh.Close)
			}
			red := conn.Redacted()
			settings := func() any {
				if sh == nil && kvStats == nil {
					return pk.Settings()
				}
				s := CacheAwareSettings{PickerSettings: pk.Settings().(cacheaware.PickerSettings)}
				if sh != nil {
					st := sh.Stats()
					s.Redis, s.Share = &red, &st
				}
				if kvStats != nil {
					s.KVEvents = kvStats()
					capacity.fill(s.KVEvents, pk.Router().Addrs())
				}
				return s
			}
			parts := policyParts{settings: settings, health: health, run: run, setTLS: setTLS, closer: func() {
				for _, c := range closers {
					c()
				}
			}}
			if sh != nil {
				parts.extra = sh
			}
			return newPolicyState(key, pk, parts), nil
		},
		apply: func(st *policyState) { st.picker.(*cacheaware.Picker).Configure(rc, tc) },
	})
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
//	    redis                 <host:port>...   # share the tree through Redis
//	    username|password|db|tls|ca_file|dial_timeout|read_timeout|key_prefix <value>
//	    kv_events             tcp://<host:port>  # exact index from engine KV events
//	    kv_events_tokenizer   engine|llmd_sim    # default engine: the replicas' /tokenize
//	    kv_events_fresh       <duration|seconds>
//	    kv_events_tokenize_timeout     <duration|seconds>
//	    kv_events_tokenize_cache       <bytes>
//	    kv_events_tokenize_concurrency <n>
//	    kv_events_replay_port <port>           # the engines' replay socket (vLLM replay_endpoint)
//	    max_body_bytes        <bytes>
//	    max_fails             <n>
//	    fail_duration         <duration|seconds>
//	}
func (p *CacheAware) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseModule(d, "cache_aware", nil, p, func(opt string, vals []string) (bool, error) {
		if opt != "cache_threshold" && opt != "balance_abs_threshold" {
			return false, nil
		}
		if err := setOption(p, opt, vals); err != nil {
			return true, err
		}
		// An explicit 0 is a value, not "default": stored as -1. Checked
		// on the parsed number, so "0.0" or "00" is a zero too.
		if opt == "cache_threshold" && p.CacheThreshold == 0 {
			p.CacheThreshold = -1
		}
		if opt == "balance_abs_threshold" && p.BalanceAbsThreshold == 0 {
			p.BalanceAbsThreshold = -1
		}
		return true, nil
	})
}
