package caddymodule

import (
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb/redisleast"
)

func init() {
	caddy.RegisterModule(GlobalRedisLeast{})
	registerCollectors(redisCollector)
}

var _ policyModule = (*GlobalRedisLeast)(nil)

// redisCollector exports every live global_redis_least store.
var redisCollector = redisleast.NewCollector(func() map[string]*redisleast.Store {
	return pickersOf[*redisleast.Store]("global_redis_least")
})

// GlobalRedisLeast is Photoroom's distributed least-request balancer: the
// in-flight count of every replica lives in a Redis sorted set shared by
// every Sluice instance in front of the pool, and each pick is one atomic
// script (least loaded among the available candidates, increment). If
// Redis is unavailable, picks fall back to this instance's own counts.
type GlobalRedisLeast struct {
	Pool string `json:"pool,omitempty"`
	redisConnection
	// MaxInflight: when even the least-loaded replica has this many
	// requests (globally), the pool is saturated: 503 at once. 0: no limit.
	MaxInflight int `json:"max_inflight,omitempty" sluice:"min=0"`
	// QueueTimeout turns on the global queueing mode (needs MaxInflight):
	// instead of a 503 at max_inflight, a request waits up to this long in
	// one FIFO queue shared by every instance, and gets the next replica
	// slot freed anywhere; 503 queue_timeout after waiting this long.
	QueueTimeout caddy.Duration `json:"queue_timeout,omitempty"`
	// CallRate bounds the Redis calls per second this instance spends on
	// picks and releases without max_inflight: within it every pick is
	// exact, beyond it picks come from the view each call refreshes and
	// go to Redis in batches. 0: the default (100); -1 ("unlimited" in
	// the Caddyfile): one call per pick and per release.
	CallRate int `json:"call_rate,omitempty" sluice:"min=-1"`
	// LeaseTTL: a crashed instance's requests stop counting within about
	// 4/3 of this (default 10s).
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// Breaker: consecutive Redis errors that switch to local picks
	// (default 3), and the probe interval while switched (default 1s).
	BreakerFailures int            `json:"breaker_failures,omitempty" sluice:"min=1"`
	BreakerBackoff  caddy.Duration `json:"breaker_backoff,omitempty"`
	// InstanceID names this instance in Redis (default: the host name, or
	// "sluice" without one, with a random suffix per start).
	InstanceID string `json:"instance_id,omitempty"`

	// Passive health, kept by each instance for itself: max_fails,
	// fail_duration (as queued_least_latency's).
	passiveHealth
	attemptOptions
	selector
}

// CaddyModule returns the Caddy module information.
func (GlobalRedisLeast) CaddyModule() caddy.ModuleInfo {
	return moduleInfo("http.reverse_proxy.selection_policies.global_redis_least", func() caddy.Module { return new(GlobalRedisLeast) })
}

func (p *GlobalRedisLeast) storeConfig() redisleast.Config {
	return redisleast.Config{
		Config: p.conn(), MaxInflight: p.MaxInflight, QueueTimeout: time.Duration(p.QueueTimeout), CallRate: p.CallRate, LeaseTTL: time.Duration(p.LeaseTTL),
		BreakerFailures: p.BreakerFailures, BreakerBackoff: time.Duration(p.BreakerBackoff), InstanceID: p.InstanceID,
		MaxFails: p.MaxFails, FailDuration: time.Duration(p.FailDuration),
	}
}

// Validate implements caddy.Validator.
func (p *GlobalRedisLeast) Validate() error {
	if err := validatePoolName(poolName(p.Pool)); err != nil {
		return fmt.Errorf("global_redis_least: %v", err)
	}
	if err := validateBodyAndHealth("global_redis_least", bodyOptions{}, p.passiveHealth); err != nil {
		return err
	}
	if err := p.storeConfig().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("global_redis_least: %v", err)
	}
	return nil
}

// Provision implements caddy.Provisioner. The store (Redis client, lease
// renewal, reaper) is shared by every config that uses the same pool with
// the same connection settings, so a reload keeps it and its leases; a
// reload that changes a connection setting makes a new store (see
// redisleast.Config.ConnectionKey), the old one serving its in-flight
// requests until the old config is cleaned up.
func (p *GlobalRedisLeast) Provision(ctx caddy.Context) error {
	if err := p.Validate(); err != nil {
		return err
	}
	name := poolName(p.Pool)
	cfg := p.storeConfig().WithDefaults()
	log, slogger := ctx.Logger(), ctx.Slogger()
	return p.provision(ctx, selectorSpec{
		attempt: p.attemptOptions,
		module:  "global_redis_least", pool: name, variant: cfg.ConnectionKey(), measure: measureAuto,
		fingerprint: fmt.Sprintf("%+v", cfg),
		build: func(key stateKey) (*policyState, error) {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := redisleast.New(dctx, cfg, name)
			if err != nil {
				return nil, fmt.Errorf("Redis %v: %v", cfg.Addrs, err)
			}
			if why := st.Unreachable(); why != nil {
				// Not fatal: a restart during a Redis outage must still serve.
				log.Error("Redis unreachable at start: serving from this instance's own counts until it answers",
					zap.String("pool", name), zap.Strings("redis", cfg.Addrs), zap.Error(why))
			}
			return newPolicyState(key, st, policyParts{settings: func() any { return redactedRedisConfig(st.Config()) },
				health: func() stateHealth { return redisLeastHealth(st) }, closer: st.Close}), nil
		},
		apply: func(ps *policyState) {
			st := ps.picker.(*redisleast.Store)
			st.SetLogger(slogger) // the latest config's log, as every setting
			if err := st.Configure(cfg); err != nil {
				log.Error("cannot apply global_redis_least settings", zap.String("pool", name), zap.Error(err))
			}
		},
	})
}

// redisLeastHealth is this instance's view of the pool's replicas: its
// own leases, and its passive health (down, failures) as load_aware's;
// ranked below the exact counts of cache_aware and load_aware on a pool
// they share (docs/api.md). In queueing mode, the global queue too (read
// from Redis, within the store's read_timeout), this instance's waiters
// counted in queue_depth.
func redisLeastHealth(st *redisleast.Store) stateHealth {
	h := stateHealth{Replicas: []backendHealth{}, Detail: leasesAndDown}
	for _, r := range st.ReplicaHealth() {
		h.Replicas = append(h.Replicas, backendHealth{Addr: r.Addr, InFlight: r.InFlight, Down: r.Down,
			Failures: r.Failures, Draining: !r.Present})
	}
	if d, queueing := st.QueueDepth(context.Background()); queueing {
		h.QueueDepth = d.Waiting
		h.GlobalQueue = &globalQueueHealth{Waiting: d.Waiting}
		if d.Err != nil {
			h.GlobalQueue.Error = d.Err.Error()
		} else {
			h.GlobalQueue.Length = &d.Queued
		}
	}
	return h
}

// redactedRedisConfig is cfg as the health report may show it.
func redactedRedisConfig(cfg redisleast.Config) redisleast.Config {
	cfg.Config = cfg.Config.Redacted()
	return cfg
}

// UnmarshalCaddyfile sets up the policy from:
//
//	lb_policy global_redis_least {
//	    pool             <name>
//	    redis            <host:port>...
//	    username         <user>
//	    password         <password>        # {env.REDIS_PASSWORD} works
//	    db               <n>
//	    tls              on|off
//	    ca_file          <path>
//	    dial_timeout     <duration>
//	    read_timeout     <duration>
//	    key_prefix       <prefix>
//	    max_inflight     <n>
//	    queue_timeout    <duration|seconds> # global queueing mode; needs max_inflight
//	    call_rate        <n>|unlimited      # Redis calls per second before picks batch (default 100)
//	    lease_ttl        <duration>
//	    breaker_failures <n>
//	    breaker_backoff  <duration>
//	    instance_id      <id>
//	    max_fails        <n>                # failed attempts that mark a replica down (this instance)
//	    fail_duration    <duration|seconds>
//	}
func (p *GlobalRedisLeast) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseModule(d, "global_redis_least", nil, p, func(opt string, vals []string) (bool, error) {
		if opt == "call_rate" && len(vals) == 1 && vals[0] == "unlimited" {
			p.CallRate = -1
			return true, nil
		}
		return false, nil
	})
}
