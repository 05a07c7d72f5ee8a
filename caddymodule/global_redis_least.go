package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redisleast"
)

func init() {
	caddy.RegisterModule(GlobalRedisLeast{})
}

// GlobalRedisLeast is Photoroom's distributed least-request balancer: the
// in-flight count of every replica lives in a Redis sorted set shared by
// every Sluice instance in front of the pool, and each pick is one atomic
// script (least loaded among the available candidates, increment). If
// Redis is unavailable, picks fall back to this instance's own counts.
type GlobalRedisLeast struct {
	Pool string `json:"pool,omitempty"`
	// Redis address(es), host:port (default 127.0.0.1:6379).
	Redis    []string `json:"redis,omitempty"`
	Username string   `json:"username,omitempty"`
	Password string   `json:"password,omitempty"`
	DB       int      `json:"db,omitempty"`
	TLS      bool     `json:"tls,omitempty"`
	CAFile   string   `json:"ca_file,omitempty"`
	// Timeouts of one Redis call (defaults 1s dial, 250ms read).
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`
	// KeyPrefix separates deployments sharing one Redis.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// MaxInflight: when even the least-loaded replica has this many
	// requests (globally), the pool is saturated: 503 at once. 0: no limit.
	MaxInflight int `json:"max_inflight,omitempty"`
	// QueueTimeout turns on the global queueing mode (needs MaxInflight):
	// instead of a 503 at max_inflight, a request waits up to this long in
	// one FIFO queue shared by every instance, and gets the next replica
	// slot freed anywhere; 503 queue_timeout after waiting this long.
	QueueTimeout caddy.Duration `json:"queue_timeout,omitempty"`
	// LeaseTTL: a crashed instance's requests stop counting within about
	// 4/3 of this (default 10s).
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
	// Breaker: consecutive Redis errors that switch to local picks
	// (default 3), and the probe interval while switched (default 1s).
	BreakerFailures int            `json:"breaker_failures,omitempty"`
	BreakerBackoff  caddy.Duration `json:"breaker_backoff,omitempty"`
	// InstanceID names this instance in Redis (default: random per start).
	InstanceID string `json:"instance_id,omitempty"`

	store  *redisleast.Store
	key    string
	pool   *lb.Pool
	varKey string
	static *staticSync
	log    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (GlobalRedisLeast) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.global_redis_least",
		New: func() caddy.Module { return new(GlobalRedisLeast) },
	}
}

func (p *GlobalRedisLeast) storeConfig() redisleast.Config {
	repl := caddy.NewReplacer()
	addrs := p.Redis
	if len(addrs) == 0 {
		addrs = []string{"127.0.0.1:6379"}
	}
	return redisleast.Config{
		Addrs: addrs, Username: p.Username, Password: repl.ReplaceKnown(p.Password, ""), DB: p.DB,
		TLS: p.TLS, CAFile: p.CAFile, DialTimeout: time.Duration(p.DialTimeout), ReadTimeout: time.Duration(p.ReadTimeout),
		KeyPrefix: p.KeyPrefix, MaxInflight: p.MaxInflight, QueueTimeout: time.Duration(p.QueueTimeout), LeaseTTL: time.Duration(p.LeaseTTL),
		BreakerFailures: p.BreakerFailures, BreakerBackoff: time.Duration(p.BreakerBackoff), InstanceID: p.InstanceID,
	}
}

// Validate implements caddy.Validator.
func (p *GlobalRedisLeast) Validate() error {
	if err := validatePoolName(poolName(p.Pool)); err != nil {
		return fmt.Errorf("global_redis_least: %v", err)
	}
	if err := p.storeConfig().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("global_redis_least: %v", err)
	}
	return nil
}

// Provision implements caddy.Provisioner. The store (Redis client, lease
// renewal, reaper) is shared by every config that uses the same pool with
// the same connection settings, so a reload keeps it and its leases.
func (p *GlobalRedisLeast) Provision(ctx caddy.Context) error {
	p.log = ctx.Logger()
	if err := p.Validate(); err != nil {
		return err
	}
	name := poolName(p.Pool)
	restorePool(name, p.log)
	p.pool = lb.GetPool(name)
	p.static = new(staticSync)
	cfg := p.storeConfig().WithDefaults()
	// The usage key includes what makes a different store: another Redis,
	// prefix, DB or instance is another connection and identity.
	p.key = strings.Join([]string{name, strings.Join(cfg.Addrs, ","), cfg.KeyPrefix, strconv.Itoa(cfg.DB), p.InstanceID}, "|")
	p.varKey = "sluice.global_redis_least." + p.key
	val, _, err := redisStores.LoadOrNew(p.key, func() (caddy.Destructor, error) {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := redisleast.New(dctx, cfg, name)
		if err != nil {
			return nil, fmt.Errorf("global_redis_least: Redis %v: %v", cfg.Addrs, err)
		}
		if why := st.Unreachable(); why != nil {
			// Not fatal: a restart during a Redis outage must still serve.
			p.log.Error("Redis unreachable at start: serving from this instance's own counts until it answers",
				zap.String("pool", name), zap.Strings("redis", cfg.Addrs), zap.Error(why))
		}
		rs := &redisStore{Store: st, log: p.log}
		rs.unwatch = p.pool.Watch(func(set []lb.Backend, managed bool) {
			if managed {
				rs.sync(lb.Dials(set))
			}
		})
		return rs, nil
	})
	if err != nil {
		return err
	}
	p.store = val.(*redisStore).Store
	registerMetrics(ctx, p.log)
	return nil
}

// Cleanup implements caddy.CleanerUpper.
func (p *GlobalRedisLeast) Cleanup() error {
	_, err := redisStores.Delete(p.key)
	return err
}

// Select implements reverseproxy.Selector: one Redis round trip.
func (p *GlobalRedisLeast) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	a := attemptFor(r, p.varKey, measureAuto)
	if a.wasRefused() {
		return nil
	}
	a.retry()
	if r.Context().Err() != nil {
		return nil
	}
	if !p.pool.Managed() {
		p.static.sync(pool, func(set []lb.Backend) {
			if err := p.store.Sync(r.Context(), lb.Dials(set)); err != nil {
				p.log.Warn("cannot sync the upstream list to Redis", zap.String("pool", p.pool.Name()), zap.Error(err))
			}
		})
	}
	cands := make([]string, 0, len(pool))
	for _, u := range pool {
		if u.Available() {
			cands = append(cands, u.Dial)
		}
	}
	lease, err := p.store.Select(r.Context(), cands)
	if err != nil {
		var rf refusal
		switch {
		case err == redisleast.ErrSaturated:
			rf = refusal{http.StatusServiceUnavailable, "pool_saturated", "every replica is at max_inflight", time.Second}
		case err == redisleast.ErrQueueTimeout:
			rf = refusal{http.StatusServiceUnavailable, "queue_timeout", "timed out waiting in the global queue", time.Second}
		case err == redisleast.ErrNoCandidates || len(cands) == 0:
			rf, _ = refusalFor(lb.ErrNoBackends, time.Second)
		default:
			var ok bool
			if rf, ok = refusalFor(err, time.Second); !ok {
				return nil
			}
		}
		a.refuse(r, w, rf)
		return nil
	}
	if !a.begin(lease) {
		return nil
	}
	return upstreamFor(pool, lease.Addr)
}

var redisStores = caddy.NewUsagePool()

type redisStore struct {
	*redisleast.Store
	unwatch func()
	log     *zap.Logger
}

func (rs *redisStore) sync(addrs []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rs.Sync(ctx, addrs); err != nil {
		rs.log.Warn("cannot sync the backend set to Redis; the store retries when Redis answers", zap.String("pool", rs.Pool()), zap.Error(err))
	}
}

// Destruct implements caddy.Destructor.
func (rs *redisStore) Destruct() error {
	rs.unwatch()
	rs.Close()
	return nil
}

// redisStoresByPool lists the live stores for metrics (one per pool; if a
// pool has several, e.g. two instance ids in one process, the first).
func redisStoresByPool() map[string]*redisleast.Store {
	out := map[string]*redisleast.Store{}
	redisStores.Range(func(_, v any) bool {
		st := v.(*redisStore).Store
		if _, ok := out[st.Pool()]; !ok {
			out[st.Pool()] = st
		}
		return true
	})
	return out
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
//	    lease_ttl        <duration>
//	    breaker_failures <n>
//	    breaker_backoff  <duration>
//	    instance_id      <id>
//	}
func (p *GlobalRedisLeast) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		return d.Errf("global_redis_least: takes no arguments, only a block; got %q", d.Val())
	}
	for d.NextBlock(0) {
		opt := d.Val()
		args := d.RemainingArgs()
		if opt == "redis" {
			if len(args) == 0 {
				return d.Errf("global_redis_least: redis needs at least one host:port")
			}
			p.Redis = append(p.Redis, args...)
			continue
		}
		if len(args) != 1 {
			return d.Errf("global_redis_least: %s takes one value", opt)
		}
		val := args[0]
		var err error
		switch opt {
		case "pool":
			p.Pool = val
		case "username":
			p.Username = val
		case "password":
			p.Password = val
		case "db":
			p.DB, err = atLeast(val, 0)
		case "tls":
			p.TLS, err = parseOnOff(val)
		case "ca_file":
			p.CAFile = val
		case "dial_timeout":
			p.DialTimeout, err = parseSecondsOrDuration(val)
		case "read_timeout":
			p.ReadTimeout, err = parseSecondsOrDuration(val)
		case "key_prefix":
			p.KeyPrefix = val
		case "max_inflight":
			p.MaxInflight, err = atLeast(val, 0)
		case "queue_timeout":
			p.QueueTimeout, err = parseSecondsOrDuration(val)
		case "lease_ttl":
			p.LeaseTTL, err = parseSecondsOrDuration(val)
		case "breaker_failures":
			p.BreakerFailures, err = atLeast(val, 1)
		case "breaker_backoff":
			p.BreakerBackoff, err = parseSecondsOrDuration(val)
		case "instance_id":
			p.InstanceID = val
		default:
			return d.Errf("global_redis_least: unknown option %q", opt)
		}
		if err != nil {
			return d.Errf("global_redis_least: bad %s %q: %v", opt, val, err)
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*GlobalRedisLeast)(nil)
	_ caddy.Validator       = (*GlobalRedisLeast)(nil)
	_ caddy.CleanerUpper    = (*GlobalRedisLeast)(nil)
	_ reverseproxy.Selector = (*GlobalRedisLeast)(nil)
	_ caddyfile.Unmarshaler = (*GlobalRedisLeast)(nil)
	_ caddy.Destructor      = (*redisStore)(nil)
)
