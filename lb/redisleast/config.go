package redisleast

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/tracker"
)

// Config is one pool's connection and policy settings. Zero values take
// the defaults (see WithDefaults).
//
// Live or not: Store.Configure applies a setting in place (read at use,
// race-free) unless it needs a new connection or a new identity in Redis;
// those need a new Store, and Config.ConnectionKey differs exactly when
// one of them does.
//
//	setting           Caddyfile          live?
//	Addrs             redis              new store (connection)
//	Username          username           new store (connection)
//	Password          password           new store (connection; only a keyed hash enters the key)
//	DB                db                 new store (connection)
//	TLS               tls                new store (connection)
//	CAFile            ca_file            new store (connection; the file is read at New)
//	DialTimeout       dial_timeout       new store (connection)
//	KeyPrefix         key_prefix         new store (every Redis key changes)
//	InstanceID        instance_id        new store (the identity records are kept under)
//	QueueTimeout      queue_timeout      live while the mode stays the same (> 0 ↔ > 0: a
//	                                     Select already waiting gets the new one, counted
//	                                     from when it began to wait);
//	                                     0 ↔ > 0 switches the queueing mode: new store
//	                                     (Configure refuses it, naming queue_timeout)
//	MaxInflight       max_inflight       live: the next Select sheds (or queues) at the new
//	                                     value; in queueing mode a raise hands the new slots
//	                                     to waiters at once
//	CallRate          call_rate          live (the next pick or release)
//	LeaseTTL          lease_ttl          live: the liveness key is renewed with the new TTL
//	                                     at once, renewal and reaping follow (every TTL/3)
//	BreakerFailures   breaker_failures   live (from the next failed call)
//	BreakerBackoff    breaker_backoff    live (the probe's wait under way too, counted
//	                                     from its start)
//	ReadTimeout       read_timeout       live (the next call); a raise beyond what the
//	                                     connection allows (rueidis drops a connection
//	                                     whose reply takes longer than max(4×read_timeout
//	                                     at the time, 1s)) makes the store redial in the
//	                                     background, same identity, no lease lost
//	PendingMax        pending_max        live (a bound below what is already pending makes
//	                                     the next queued release rotate the identity, as
//	                                     any overflow does)
//	MaxFails          max_fails          live (from the next failure)
//	FailDuration      fail_duration      live (from the next failure)
type Config struct {
	// Connection settings (redis, username, password, db, tls, ca_file,
	// dial_timeout, read_timeout, key_prefix). ReadTimeout is the longest
	// a Select waits for a Redis that stopped answering; every key of a
	// pool carries the hash tag {sluice:<KeyPrefix>:<pool>}.
	redisconn.Config
	// MaxInflight sheds (ErrSaturated) when even the least-loaded
	// candidate has this many requests in flight; 0 = never shed. In
	// queueing mode it is the number of slots per replica instead.
	MaxInflight int
	// CallRate bounds, in the least-request mode (MaxInflight 0), the
	// Redis calls per second (16 at once) this instance spends on picks
	// and releases: within it every pick is exact and every release
	// immediate; beyond it picks come from the view refreshed by each call
	// and everything goes to Redis in batches (see batcher). Default 100
	// (each call costs the proxy 30-100 µs of CPU over loopback); -1
	// (Caddyfile "unlimited"): one call per pick and per release, as the
	// seed does.
	CallRate int
	// LeaseTTL is how long an instance's records outlive its last sign of
	// life (default 10s); renewed every LeaseTTL/3.
	LeaseTTL time.Duration
	// BreakerFailures consecutive Redis errors (default 3), or one timeout,
	// open the breaker for BreakerBackoff (default 1s), after which a
	// background probe decides whether to close it.
	BreakerFailures int
	BreakerBackoff  time.Duration
	// QueueTimeout > 0 turns on the queueing mode (needs MaxInflight > 0):
	// instead of shedding, a request waits up to QueueTimeout in one FIFO
	// queue shared by every instance of the pool, and the oldest waiter
	// anywhere that may use the next free slot (one of its candidates)
	// gets it (ErrQueueTimeout when it waited too long). Every instance of
	// a pool must use the same mode and MaxInflight. See queue.go.
	QueueTimeout time.Duration
	// InstanceID names this instance in Redis (default: the host name); a
	// random suffix is always appended, so a restarted instance never
	// adopts the records of its predecessor.
	InstanceID string
	// PendingMax bounds the releases kept while Redis is unreachable
	// (default 65536); see pending.go for what happens beyond it.
	PendingMax int
	// Passive health, this instance's own (not shared through Redis):
	// MaxFails consecutive failed attempts (transport error or 5xx) mark a
	// replica down (default 1) for FailDuration (default 5s), doubling on
	// each further failure up to 16×; then one probe request at a time.
	MaxFails     int
	FailDuration time.Duration
}

// DefaultCallRate is CallRate's default: Redis calls per second before
// the least-request mode batches (see batcher).
const DefaultCallRate = 100

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	c.Config = c.Config.WithDefaults()
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.CallRate == 0 {
		c.CallRate = DefaultCallRate
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 3
	}
	if c.BreakerBackoff == 0 {
		c.BreakerBackoff = time.Second
	}
	if c.InstanceID == "" {
		c.InstanceID, _ = os.Hostname()
		if c.InstanceID == "" {
			c.InstanceID = "sluice"
		}
	}
	if c.PendingMax == 0 {
		c.PendingMax = 1 << 16
	}
	if c.MaxFails == 0 {
		c.MaxFails = 1
	}
	if c.FailDuration == 0 {
		c.FailDuration = 5 * time.Second
	}
	return c
}

// Validate reports the first bad field by name. Call it on WithDefaults().
func (c Config) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	switch {
	case c.MaxInflight < 0:
		return fmt.Errorf("max_inflight: must be >= 0, got %d", c.MaxInflight)
	case c.CallRate < -1:
		return fmt.Errorf("call_rate: must be > 0 calls per second, or unlimited (-1), got %d", c.CallRate)
	case c.LeaseTTL < 30*time.Millisecond:
		return fmt.Errorf("lease_ttl: must be at least 30ms, got %v", c.LeaseTTL)
	case c.BreakerFailures < 1:
		return fmt.Errorf("breaker_failures: must be >= 1, got %d", c.BreakerFailures)
	case c.BreakerBackoff <= 0:
		return fmt.Errorf("breaker_backoff: must be > 0, got %v", c.BreakerBackoff)
	case c.QueueTimeout < 0:
		return fmt.Errorf("queue_timeout: must be >= 0, got %v", c.QueueTimeout)
	case c.QueueTimeout > 0 && c.MaxInflight == 0:
		return errors.New("queue_timeout: the queueing mode needs max_inflight > 0 (the slots per replica)")
	case c.PendingMax < 1:
		return fmt.Errorf("pending_max: must be >= 1, got %d", c.PendingMax)
	case c.MaxFails < 1:
		return fmt.Errorf("max_fails: must be >= 1, got %d", c.MaxFails)
	case c.FailDuration < 0:
		return fmt.Errorf("fail_duration: must be > 0, got %v", c.FailDuration)
	}
	return nil
}

// queueing is the mode the config asks for: the global queue, else
// least-request. A store's mode is fixed at New.
func (c Config) queueing() bool { return c.QueueTimeout > 0 }

// Mode names (modeName).
const (
	modeLeastRequest = "off" // no queue: least-request (exact or batched)
	modeQueue        = "queueing"
)

// modeName names the mode the config asks for: New builds that mode, and
// the connection key carries the name, so that switching it needs a new
// store. The one place the mode is asked.
func (c Config) modeName() string {
	if c.queueing() {
		return modeQueue
	}
	return modeLeastRequest
}

// clientOption maps the config onto rueidis (see redisconn).
func (c Config) clientOption() (rueidis.ClientOption, error) {
	return c.ClientOption(redisconn.ConnTimeout(c.ReadTimeout))
}

// connectionFields are the settings that need a new Store, by name (the
// Caddyfile's), with the value that tells them apart: ConnectionKey and
// Configure's refusal both come from this one list.
func (c Config) connectionFields() [][2]string {
	c = c.WithDefaults()
	return append(c.Config.Fields(),
		[2]string{"instance_id", c.InstanceID},
		[2]string{"queue_timeout", c.modeName()}, // the queueing mode, not the duration
	)
}

// ConnectionKey identifies the settings that need a new Store (see the
// table at Config): two configs have the same key exactly when those
// settings are equal (defaults applied), so a store built for one can be
// Configured with the other. Every value is quoted, so no two different
// configs share a key. The password enters only as a keyed hash, the key
// being random per process: the string may be logged or shown, and it is
// only ever compared within one process.
func (c Config) ConnectionKey() string { return redisconn.FieldsKey(c.connectionFields()) }

// connectionChange names the first setting that differs between c and
// o and needs a new store; "" if none does.
func (c Config) connectionChange(o Config) string {
	a, b := c.connectionFields(), o.connectionFields()
	for i := range a {
		if a[i] != b[i] {
			return a[i][0]
		}
	}
	return ""
}

func (c Config) healthConfig() tracker.Config {
	return tracker.Config{MaxFails: c.MaxFails, FailDuration: c.FailDuration}
}

// Config returns the configuration in force (defaults applied).
func (s *Store) Config() Config { return s.conf() }

// Configure applies cfg's live settings in place (see the table at
// Config); what a call already under way read keeps its old value. It
// refuses, changing nothing, a cfg that does not validate, or one whose
// connection settings (ConnectionKey) differ from the store's: the error
// names the first such setting, e.g. queue_timeout when the queueing mode
// would switch on or off.
func (s *Store) Configure(cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	return s.configure(cfg)
}
