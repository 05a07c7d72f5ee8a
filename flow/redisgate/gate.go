// Package redisgate makes the flow control of many Sluice instances in
// front of one pool admit no more than the pool's capacity in total.
//
// Each instance holds a share of the capacity, recorded in Redis (see
// claimScript), and dispatches only while what it has in flight is below
// its share. Queues, priority and fairness stay local; only the count is
// global. The request path never waits for Redis: one goroutine per pool
// claims more when requests wait and gives back what is no longer needed,
// and the controller dispatches against the share already held. A
// crashed instance's share comes back when its lease runs out; while
// Redis is away each instance dispatches against a fallback share.
package redisgate

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redisconn"
)

// Config is one pool's gate.
type Config struct {
	Conn redisconn.Config
	Pool string
	// LeaseTTL: a crashed instance's share is reclaimed within about
	// this long (default 5s; renewed every third of it).
	LeaseTTL time.Duration
	// FallbackShare is the fraction of the pool's capacity an instance
	// dispatches against while Redis is away (0: 1/N, N the instances
	// seen at the last answer, 1 before any).
	FallbackShare float64
	// Poll is how soon an instance whose requests wait for more of the
	// capacity asks again (default 5ms): capacity another instance gives
	// back reaches it within this.
	Poll time.Duration
	// Instance names this instance in Redis (default: host name + a
	// random suffix, new on every start).
	Instance string
	// OnFallback, if set, is called when the gate enters (err != nil) or
	// leaves (err == nil) the fallback share.
	OnFallback func(err error)
	// OnRepair, if set, is called when a claim found some of the pool's
	// records in Redis corrupt or stray and repaired them: n of them,
	// what names the key and what was wrong (the first few).
	OnRepair func(n int64, what string)
}

// Defaults.
const (
	DefaultLeaseTTL = 5 * time.Second
	DefaultPoll     = 5 * time.Millisecond
	retryBackoff    = time.Second
	// atShareWait × Poll is how soon an instance that holds its whole
	// share asks again while its requests wait.
	atShareWait = 4
)

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	c.Conn = c.Conn.WithDefaults()
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Poll == 0 {
		c.Poll = DefaultPoll
	}
	if c.Instance == "" {
		c.Instance = redisconn.InstanceID("")
	}
	return c
}

// Validate reports the first bad field by its Caddyfile name.
func (c Config) Validate() error {
	if err := c.Conn.Validate(); err != nil {
		return err
	}
	switch {
	case c.LeaseTTL < 0:
		return fmt.Errorf("lease_ttl: must be > 0, got %v", c.LeaseTTL)
	case c.LeaseTTL > 0 && c.LeaseTTL < 3*c.Conn.ReadTimeout:
		return fmt.Errorf("lease_ttl: %v is shorter than 3 × read_timeout (%v): leases would lapse while renewing", c.LeaseTTL, c.Conn.ReadTimeout)
	case c.FallbackShare < 0 || c.FallbackShare > 1 || math.IsNaN(c.FallbackShare):
		return fmt.Errorf("fallback_share: must be within 0..1, got %v", c.FallbackShare)
	case c.Poll < 0:
		return fmt.Errorf("poll: must be > 0, got %v", c.Poll)
	}
	return nil
}

// Stats are the gate's state now, for health output and metrics.
type Stats struct {
	Instance string `json:"instance"`
	// Allowed is the units this instance may have in flight now
	// (requests, or tokens in tokens mode); Held what Redis counts for
	// it (more than Allowed while requests beyond its share finish).
	Allowed int64 `json:"allowed"`
	Held    int64 `json:"held"`
	// Entitled is its fair share at the last answer; PoolHeld what every
	// instance held then, Capacity the pool's limit, Instances how many
	// held or wanted some.
	Entitled  int64 `json:"entitled"`
	PoolHeld  int64 `json:"pool_held"`
	Capacity  int64 `json:"capacity"`
	Instances int64 `json:"instances"`
	// Fallback: Redis is away and the instance uses its fallback share.
	Fallback bool `json:"fallback"`
	// Settling: Redis went back in time (lost or restored older records)
	// less than a lease ago; no instance is granted more until every one
	// has written back what it holds.
	Settling    bool   `json:"settling,omitempty"`
	Claims      uint64 `json:"claims"`
	RedisErrors uint64 `json:"redis_errors"`
	LastError   string `json:"last_error,omitempty"`
	// Repairs counts the pool's records in Redis that this instance's
	// claims found corrupt or stray and repaired (claimScript);
	// LastRepair says what the last was, naming the key.
	Repairs    uint64 `json:"repairs,omitempty"`
	LastRepair string `json:"last_repair,omitempty"`
}

// Gate is a flow.SaturationDetector over a share of the pool held in
// Redis. The protocol with the controller is one-way both ways round: the
// controller asks the gate (Saturation) and publishes its demand to the
// gate's Feed; the gate reads the feed and never calls the controller.
// When Redis grants more, the gate's answer says so (Verdict.Recheck),
// and the controller asks again. Install it as the controller's detector
// with flow.PublishDemand(g.Feed()); set the pool-wide limit with
// SetLocal.
type Gate struct {
	cfgp atomic.Pointer[Config]
	// keys are the pool's records per unit (unitIndex): requests and
	// tokens are counted apart (unit.go).
	keys [2]Keys

	local atomic.Pointer[flow.ConcurrencyDetector]
	// feed is where the controller publishes what it holds and queues.
	feed *flow.DemandFeed
	// recheck is ready when allowed grew: the controller asks again.
	recheck chan struct{}
	// allowed is what the controller may have in flight (it dispatches
	// while below it). Redis's record of this instance is never below it
	// nor below what is in flight, so the pool's total in Redis bounds
	// what is really in flight. allowedTokens is its unit (setAllowed).
	allowed       atomic.Int64
	allowedTokens atomic.Bool
	// held is what Redis counted for this instance at the last claim.
	held atomic.Int64
	// shares are this instance's share of the pool per flow at the last
	// claim (nil: none known, e.g. while Redis is away).
	shares atomic.Pointer[flow.FlowShares]
	// instances is how many instances held or wanted a share at the
	// last claim.
	instances atomic.Int64

	// seen is what the last answer said of the pool's records per unit
	// (claimScript); claimed whether this instance has claimed yet, and
	// claimedTokens in which unit its record is. Only the claimer
	// goroutine touches them.
	seen          [2]seen
	claimed       bool
	claimedTokens bool

	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	stats Stats
}

// New starts the gate of one pool. It does not wait for Redis: until the
// first answer the instance holds nothing (requests wait for it), and if
// Redis cannot be reached it uses the fallback share.
func New(cfg Config) (*Gate, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := cfg.Conn.ClientOption(0); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Gate{keys: [2]Keys{KeysForUnit(cfg.Conn.KeyPrefix, cfg.Pool, false), KeysForUnit(cfg.Conn.KeyPrefix, cfg.Pool, true)},
		wake: make(chan struct{}, 1),
		feed: flow.NewDemandFeed(), recheck: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	g.cfgp.Store(&cfg)
	g.stats.Instance = cfg.Instance
	go g.run(ctx)
	return g, nil
}

// Config is the gate's configuration (defaults applied).
func (g *Gate) Config() Config { return *g.cfgp.Load() }

// Configure applies the settings that can change live: LeaseTTL,
// FallbackShare, Poll, OnFallback, OnRepair and the connection's
// ReadTimeout (each call's bound). The rest of the connection, the pool and the instance
// stay (a change of those needs a new gate).
func (g *Gate) Configure(cfg Config) error {
	old := g.Config()
	rt := cfg.Conn.ReadTimeout
	cfg.Conn, cfg.Pool, cfg.Instance = old.Conn, old.Pool, old.Instance
	cfg.Conn.ReadTimeout = rt
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	g.cfgp.Store(&cfg)
	g.poke()
	return nil
}

// SetLocal sets the detector whose pool-wide limit the gate shares out
// (max_concurrency × replicas); call it again when the config changes.
func (g *Gate) SetLocal(d *flow.ConcurrencyDetector) {
	g.local.Store(d)
	g.poke()
}

// Feed is where the controller this gate answers publishes its demand
// (flow.PublishDemand).
func (g *Gate) Feed() *flow.DemandFeed { return g.feed }

// Close stops the gate. What it holds is given back down to what is still
// in flight; that part lapses with the lease.
func (g *Gate) Close() {
	g.cancel()
	<-g.done
}

// Saturation implements flow.SaturationDetector. Load is what is in
// flight as a fraction of this instance's share (1 with no share);
// Capacity the pool's (band queues are sized from it), of which this
// instance queues 1 / the instances holding or wanting a share at the
// last claim, so that N instances queue about what one flow control in
// front of the pool would, not N times as much; Shares its share per
// flow; Recheck is ready when Redis granted more.
func (g *Gate) Saturation(in flow.InFlight) flow.Verdict {
	v := flow.Verdict{Load: 1, QueueShare: 1 / float64(max(g.instances.Load(), 1)),
		Shares: g.shares.Load(), Recheck: g.recheck}
	limit, tokens := g.poolLimit()
	if !tokens {
		v.Capacity = limit
	}
	if allowed := g.allowedIn(tokens); allowed > 0 {
		v.Load = float64(unitsOf(in, tokens)) / float64(allowed)
	}
	return v
}

// wantsClaim reports whether the instance, by the demand its controller
// last published, wants other than it may have, or can give some back.
func (g *Gate) wantsClaim() bool {
	in, queued := g.feed.Totals()
	want := g.units(in) + g.units(queued)
	return want != g.allowed.Load() || want < g.held.Load()
}

// Stats returns the gate's state now.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	s.Allowed, s.Held = g.allowed.Load(), g.held.Load()
	return s
}

func (g *Gate) units(in flow.InFlight) int64 {
	_, tokens := g.poolLimit()
	return unitsOf(in, tokens)
}

func (g *Gate) poolLimit() (int64, bool) {
	if d := g.local.Load(); d != nil {
		return d.PoolLimit()
	}
	return 0, false
}

func (g *Gate) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// run is the claimer: the only goroutine that talks to Redis and the only
// writer of allowed.
func (g *Gate) run(ctx context.Context) {
	defer close(g.done)
	var cl rueidis.Client
	defer func() {
		if cl != nil {
			g.leave(cl)
			cl.Close()
		}
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	// away: the last call to Redis failed. The timer then holds the
	// retry; requests coming and going do not call Redis again (before,
	// each did: a down Redis met a reconnect storm at the request rate).
	away := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.wake:
		case <-timer.C:
		case <-g.feed.Changed():
			if away {
				g.fallbackShare() // of the capacity now (replicas come and go)
				continue
			}
			if !g.wantsClaim() {
				continue // the timer stays set
			}
		}
		if cl == nil {
			var err error
			if cl, err = g.dial(); err != nil {
				g.failed(err)
				away = true
				resetTimer(timer, retryBackoff)
				continue
			}
		}
		next, err := g.sync(ctx, cl)
		away = err != nil
		if err != nil {
			g.failed(err)
			// What this instance holds lapses a lease after its last
			// renewal: retry within a third of it, as a renewal would, so
			// that one failed claim does not cost a short lease (lease_ttl
			// may be 3 × read_timeout, under the second of retryBackoff).
			next = min(retryBackoff, g.Config().LeaseTTL/3)
		}
		resetTimer(timer, next)
	}
}

func (g *Gate) dial() (rueidis.Client, error) {
	opt, err := g.Config().Conn.ClientOption(redisconn.ConnTimeout(g.Config().Conn.ReadTimeout))
	if err != nil {
		return nil, err
	}
	return rueidis.NewClient(opt)
}

// sync is one claim: lower allowed to what is needed (under the
// controller's lock, so nothing is dispatched past it meanwhile), tell
// Redis what may be in flight and what is wanted, then allow what Redis
// granted within the fair share. It returns when to run again.
func (g *Gate) sync(ctx context.Context, cl rueidis.Client) (time.Duration, error) {
	g.mu.Lock()
	fallback, entitled := g.stats.Fallback, g.stats.Entitled
	g.mu.Unlock()
	var inUse, want, inOldUnit int64
	var demand string
	names := map[string]string{} // flowName → flow id
	capacity, tokens := g.poolLimit()
	// concurrency_mode switched since this instance's last claim: its
	// record and allowed count the other unit (unit.go).
	switching := g.claimed && g.claimedTokens != tokens
	// Under the controller's lock (see flow.DemandFeed.Read): what is in
	// flight is exact, and once allowed is lowered no dispatch passes the
	// old value, so floor below covers every request in flight until the
	// next claim.
	g.feed.Read(tokens, func(d flow.Demand) {
		inUse, want = unitsOf(d.InFlight, tokens), unitsOf(d.InFlight, tokens)+unitsOf(d.Queued, tokens)
		demand = encodeDemand(d.Flows, tokens)
		for _, f := range d.Flows {
			names[flowName(f.FlowID)] = f.FlowID
		}
		if switching {
			// Nothing is dispatched on the old unit's figure from now;
			// the claim below counts what is in flight in the new one.
			inOldUnit = unitsOf(d.InFlight, !tokens)
			g.setAllowed(0, tokens)
			return
		}
		if fallback {
			return // keep the fallback share until Redis has counted it
		}
		// Beyond its fair share an instance stops dispatching now, and
		// gives the units back as its requests finish.
		if target := min(want, entitled); target < g.allowed.Load() {
			g.allowed.Store(target)
		}
	})
	if switching {
		// Instances still on the old unit keep seeing what this one has
		// in flight, for a lease.
		if err := g.leaveUnit(ctx, cl, !tokens, inOldUnit); err != nil {
			return 0, err
		}
		g.claimedTokens = tokens
	}
	floor := max(g.allowedIn(tokens), inUse)

	u := unitIndex(tokens)
	cctx, cancel := context.WithTimeout(ctx, g.Config().Conn.ReadTimeout)
	res, err := claim(cctx, cl, g.keys[u], g.Config().Instance, floor, want, demand, capacity, g.Config().LeaseTTL, g.seen[u])
	cancel()
	if err != nil {
		return 0, err
	}
	g.seen[u] = res.seen
	g.claimed, g.claimedTokens = true, tokens
	allowed := min(res.held, res.entitled)
	if res.contended && res.held == res.entitled && allowed > 0 {
		// Another instance waits for its share: the next unit that frees
		// up here goes back to Redis (and to it), not to this queue. The
		// claim that follows that release restores this share.
		allowed--
	}
	g.held.Store(res.held)
	g.shares.Store(parseShares(res.shares, names, tokens))
	g.instances.Store(res.instances)
	before := g.setAllowed(allowed, tokens)
	g.mu.Lock()
	g.stats.Claims++
	g.stats.Entitled, g.stats.PoolHeld = res.entitled, res.total
	g.stats.Instances, g.stats.Capacity = res.instances, capacity
	g.stats.LastError = ""
	g.stats.Fallback = false
	g.stats.Settling = res.settling
	if res.repairs > 0 {
		g.stats.Repairs += uint64(res.repairs)
		g.stats.LastRepair = res.repairNote
	}
	g.mu.Unlock()
	if res.repairs > 0 && g.Config().OnRepair != nil {
		g.Config().OnRepair(res.repairs, res.repairNote)
	}
	if fallback && g.Config().OnFallback != nil {
		g.Config().OnFallback(nil)
	}
	if allowed > before || switching {
		g.signalRecheck()
	}
	switch {
	case fallback && res.held > allowed:
		// Back from the fallback share: this claim recorded all of it
		// (it may have been in use); the next gives back at once what is
		// not, instead of holding it from the others until the renewal.
		return g.Config().Poll, nil
	case want > allowed && res.held < res.entitled:
		// Requests wait for units owed to this instance: ask again soon,
		// for what others give back. (What this instance holds beyond its
		// share is given back as its requests finish: each release runs a
		// claim.)
		return g.Config().Poll, nil
	case want > allowed:
		// Requests wait, but the instance holds its whole share: only a
		// change of the shares can give it more. Asking as often as an
		// instance that is owed units only loads Redis (every claim reads
		// every instance's demand).
		return atShareWait * g.Config().Poll, nil
	case res.held > 0 || want > 0:
		return g.Config().LeaseTTL / 3, nil // renew the lease
	case res.total > 0:
		// Idle while others hold units: ask again at the renewal's pace,
		// so the pool's figures it shows (pool_held, instances) follow
		// the others' giving back, not the moment it went idle.
		return g.Config().LeaseTTL / 3, nil
	default:
		return time.Hour, nil // idle: nothing to renew until a request comes
	}
}

// failed switches to the fallback share after a Redis error.
func (g *Gate) failed(err error) {
	g.shares.Store(nil) // local fairness alone while Redis is away
	g.mu.Lock()
	g.stats.RedisErrors++
	g.stats.LastError = err.Error()
	entering := !g.stats.Fallback
	g.stats.Fallback = true
	g.mu.Unlock()
	g.fallbackShare()
	if entering && g.Config().OnFallback != nil {
		g.Config().OnFallback(err)
	}
}

// fallbackShare sets allowed to the fallback share of the pool's
// capacity now (the claimer calls it while Redis is away).
func (g *Gate) fallbackShare() {
	g.mu.Lock()
	instances := g.stats.Instances
	g.mu.Unlock()
	share := g.Config().FallbackShare
	if share == 0 {
		share = 1 / float64(max(instances, 1))
	}
	limit, tokens := g.poolLimit()
	units := int64(math.Floor(share * float64(limit)))
	if limit > 0 {
		units = max(units, 1)
	}
	if g.setAllowed(units, tokens) < units {
		g.signalRecheck()
	}
}

// leave gives back what is not in flight, at shutdown, from the records
// of the unit this instance last claimed in.
func (g *Gate) leave(cl rueidis.Client) {
	tokens := g.claimedTokens
	if !g.claimed {
		// a claim whose answer was lost may have left a record
		_, tokens = g.poolLimit()
	}
	var inUse int64
	g.feed.Read(false, func(d flow.Demand) { inUse = unitsOf(d.InFlight, tokens) })
	_ = g.leaveUnit(context.Background(), cl, tokens, inUse)
}

// signalRecheck tells the controller, through the answer it last got,
// that the answer changed: allowed grew.
func (g *Gate) signalRecheck() {
	select {
	case g.recheck <- struct{}{}:
	default: // already signalled
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}
