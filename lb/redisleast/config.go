package redisleast

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/redis/rueidis"
)

// Config is one pool's connection and policy settings. Zero values take
// the defaults (see WithDefaults).
type Config struct {
	// Addrs are Redis nodes (host:port); one address of a cluster is enough.
	Addrs              []string
	Username, Password string
	DB                 int
	// TLS dials with TLS; CAFile, when set, replaces the system roots.
	TLS    bool
	CAFile string
	// DialTimeout bounds connecting (default 1s). ReadTimeout bounds every
	// Redis call made on behalf of a request (default 250ms): it is the
	// longest a Select waits for a Redis that stopped answering.
	DialTimeout, ReadTimeout time.Duration
	// KeyPrefix separates deployments sharing one Redis; every key of a
	// pool carries the hash tag {sluice:<KeyPrefix>:<pool>}.
	KeyPrefix string
	// MaxInflight sheds (ErrSaturated) when even the least-loaded
	// candidate has this many requests in flight; 0 = never shed. In
	// queueing mode it is the number of slots per replica instead.
	MaxInflight int
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
	// anywhere gets the next free slot (ErrQueueTimeout when it waited
	// too long). Every instance of a pool must use the same mode and
	// MaxInflight. See queue.go.
	QueueTimeout time.Duration
	// InstanceID names this instance in Redis (default: the host name); a
	// random suffix is always appended, so a restarted instance never
	// adopts the records of its predecessor.
	InstanceID string
	// PendingMax bounds the releases kept while Redis is unreachable
	// (default 65536); see pending.go for what happens beyond it.
	PendingMax int
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.DialTimeout == 0 {
		c.DialTimeout = time.Second
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 250 * time.Millisecond
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
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
	return c
}

// Validate reports the first bad field by name. Call it on WithDefaults().
func (c Config) Validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("addrs: at least one Redis address is required")
	}
	for _, a := range c.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("addrs: %q is not host:port: %v", a, err)
		}
	}
	switch {
	case c.DB < 0:
		return fmt.Errorf("db: must be >= 0, got %d", c.DB)
	case c.CAFile != "" && !c.TLS:
		return errors.New("ca_file: set only together with tls")
	case c.DialTimeout < 0:
		return fmt.Errorf("dial_timeout: must be > 0, got %v", c.DialTimeout)
	case c.ReadTimeout < 0:
		return fmt.Errorf("read_timeout: must be > 0, got %v", c.ReadTimeout)
	case c.MaxInflight < 0:
		return fmt.Errorf("max_inflight: must be >= 0, got %d", c.MaxInflight)
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
	}
	if c.CAFile != "" {
		if _, err := c.tlsConfig(); err != nil {
			return err
		}
	}
	return nil
}

func (c Config) tlsConfig() (*tls.Config, error) {
	if !c.TLS {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %v", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file: no PEM certificate in %s", c.CAFile)
		}
	}
	return tc, nil
}

// clientOption maps the config onto rueidis. Retries are off: the select
// script is not a read-only command, and a resent script must never be
// applied twice (the scripts are idempotent by request id anyway).
func (c Config) clientOption() (rueidis.ClientOption, error) {
	tc, err := c.tlsConfig()
	if err != nil {
		return rueidis.ClientOption{}, err
	}
	return rueidis.ClientOption{
		InitAddress:  c.Addrs,
		Username:     c.Username,
		Password:     c.Password,
		SelectDB:     c.DB,
		TLSConfig:    tc,
		Dialer:       net.Dialer{Timeout: c.DialTimeout, KeepAlive: 30 * time.Second},
		DisableRetry: true,
		// One auto-pipelined connection: Redis runs scripts on one thread
		// anyway, a release then never overtakes its select, and after a
		// Redis restart only one stale connection has to fail.
		PipelineMultiplex: -1,
		DisableCache:      true, // no client-side caching: every read must be the global truth
		// Connection-level deadline (also for rueidis's keep-alive PINGs):
		// generous, since each call carries its own ReadTimeout context.
		ConnWriteTimeout: max(4*c.ReadTimeout, time.Second),
	}, nil
}
