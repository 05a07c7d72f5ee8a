// Package redisconn holds what every Redis-backed part of Sluice shares
// about reaching Redis: the connection settings, their validation and
// defaults, the rueidis options they map to, the key that tells whether
// two configs can share one connection, and how Sluice names things in
// Redis (key tags, instance ids: naming.go).
package redisconn

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Config is how to reach Redis. Zero values take the defaults (see
// WithDefaults). Every field needs a new connection to change.
type Config struct {
	// Addrs are Redis nodes (host:port); one address of a cluster is enough.
	Addrs              []string
	Username, Password string
	DB                 int
	// TLS dials with TLS; CAFile, when set, replaces the system roots.
	TLS    bool
	CAFile string
	// DialTimeout bounds connecting (default 1s). ReadTimeout bounds every
	// Redis call made on behalf of a request (default 250ms).
	DialTimeout, ReadTimeout time.Duration
	// KeyPrefix separates deployments sharing one Redis.
	KeyPrefix string
}

// WithDefaults fills zero timeouts.
func (c Config) WithDefaults() Config {
	if c.DialTimeout == 0 {
		c.DialTimeout = time.Second
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 250 * time.Millisecond
	}
	return c
}

// Validate reports the first bad field by its Caddyfile name. Call it on
// WithDefaults().
func (c Config) Validate() error {
	if len(c.Addrs) == 0 {
		return errors.New("redis: at least one Redis address is required")
	}
	for _, a := range c.Addrs {
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("redis: %q is not host:port: %v", a, err)
		}
		// A port dialling could never use must fail the load: unreachable
		// Redis is not an error at load, so a typo would go unnoticed.
		if p, err := net.LookupPort("tcp", port); err != nil || p == 0 {
			return fmt.Errorf("redis: %q has no usable port (1-65535)", a)
		}
	}
	// Redis Cluster hashes a key by what lies up to the first '}': one in
	// the prefix would end every pool's tag there, putting all the
	// deployment's pools in one slot.
	if strings.Contains(c.KeyPrefix, "}") {
		return fmt.Errorf("key_prefix: %q may not contain '}' (it would cut the keys' hash tag)", c.KeyPrefix)
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
	}
	if c.CAFile != "" {
		if _, err := c.TLSConfig(); err != nil {
			return err
		}
	}
	return nil
}

// TLSConfig is the client TLS configuration (nil without TLS).
func (c Config) TLSConfig() (*tls.Config, error) {
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

// ConnTimeout is the connection-level deadline (rueidis's
// ConnWriteTimeout, also its keep-alive PINGs' timeout) for a read
// timeout: generous, since each call carries its own ReadTimeout context,
// but short enough that a dead connection (a failover to another host)
// is dropped and redialled within about a second.
func ConnTimeout(readTimeout time.Duration) time.Duration {
	return max(4*readTimeout, time.Second)
}

// ClientOption maps the config onto rueidis with the given connection
// deadline (see ConnTimeout). Retries are off: Sluice's scripts are not
// read-only, and a resent one must never be applied twice.
func (c Config) ClientOption(connWriteTimeout time.Duration) (rueidis.ClientOption, error) {
	tc, err := c.TLSConfig()
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
		// anyway, a write then never overtakes an earlier one, and after a
		// Redis restart only one stale connection has to fail.
		PipelineMultiplex: -1,
		DisableCache:      true, // no client-side caching: every read must be the global truth
		ConnWriteTimeout:  connWriteTimeout,
	}, nil
}

// Fields are the settings, by Caddyfile name, with the value that tells
// two configs apart (defaults applied; the password only as a keyed
// hash). Users build their connection keys from them.
func (c Config) Fields() [][2]string {
	c = c.WithDefaults()
	return [][2]string{
		{"redis", fmt.Sprintf("%q", c.Addrs)},
		{"username", c.Username},
		{"password", SecretDigest(c.Password)},
		{"db", strconv.Itoa(c.DB)},
		{"tls", strconv.FormatBool(c.TLS)},
		{"ca_file", c.CAFile},
		{"dial_timeout", c.DialTimeout.String()},
		{"key_prefix", c.KeyPrefix},
	}
}

// FieldsKey joins fields (Fields, maybe with a user's own) into one
// comparable connection key: name="value" pairs separated by spaces.
func FieldsKey(fields [][2]string) string {
	var b strings.Builder
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%q", f[0], f[1])
	}
	return b.String()
}

// Redacted is c as a health report or log may show it.
func (c Config) Redacted() Config {
	if c.Password != "" {
		c.Password = "(set)"
	}
	return c
}

// digestKey keys SecretDigest: random per process, so a digest seen in a
// log cannot be checked against guessed passwords.
var digestKey = func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return b
}()

// SecretDigest is a keyed hash of a secret, comparable within one process
// only ("" for no secret).
func SecretDigest(secret string) string {
	if secret == "" {
		return ""
	}
	m := hmac.New(sha256.New, digestKey)
	m.Write([]byte(secret))
	return "hmac:" + hex.EncodeToString(m.Sum(nil)[:12])
}
