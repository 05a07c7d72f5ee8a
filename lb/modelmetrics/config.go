package modelmetrics

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"time"
)

// MaxBodyBytes bounds the metrics body read from a replica; a larger body
// is a failed scrape. vLLM's full output is around 100 KiB.
const MaxBodyBytes = 4 << 20

// Config sets a Scraper. Zero values take the defaults.
type Config struct {
	// Interval between scrapes of a target (default 1s).
	Interval time.Duration
	// Timeout of one scrape (default Interval/2).
	Timeout time.Duration
	// Staleness: values older than this are Stale (default 3×Interval).
	Staleness time.Duration
	// MinRefresh is the shortest time between two rounds that Refresh
	// asks for (default 50ms, as often as GIE's endpoint picker reads
	// every replica; at most Interval).
	MinRefresh time.Duration
	// MaxBackoff caps the wait after failed scrapes: a target whose scrape
	// fails is tried again after Interval, then twice as long per further
	// failure up to this, and every Interval again after a success
	// (default 30s; at least Interval).
	MaxBackoff time.Duration
	// Path of the metrics endpoint on each target (default "/metrics").
	Path string
	// Settled, if set, says a target's sample holds all its reader wants
	// from it (a size fixed at the engine's start): after such a sample
	// the target is scraped every SettledInterval (default 30s) instead
	// of every Interval, which only notices a restart with new values.
	// Not part of the config's JSON (health answers show the settings;
	// a func cannot be encoded, set or not).
	Settled         func(Sample) bool `json:"-"`
	SettledInterval time.Duration
	// Client, if set, makes the requests; by default the scraper uses its
	// own transport (no proxy from the environment, see Transport), closed
	// when Run ends.
	Client *http.Client
	// TLS is the client TLS config for targets at https:// URLs: the one
	// the proxy in front of the replicas uses for them (trusted CAs, a
	// client certificate, a server name); nil: the system's roots and Go's
	// defaults. Cloned, not changed. Unused with Client. Configure with
	// another pointer builds a new transport. Not in the JSON (it holds
	// keys and funcs; health shows the proxy's own settings).
	TLS *tls.Config `json:"-"`
}

// WithDefaults fills zero (and negative) fields.
func (c Config) WithDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = c.Interval / 2
	}
	if c.Staleness <= 0 {
		c.Staleness = 3 * c.Interval
	}
	if c.MinRefresh <= 0 {
		c.MinRefresh = min(50*time.Millisecond, c.Interval)
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	c.MaxBackoff = max(c.MaxBackoff, c.Interval)
	if c.Path == "" {
		c.Path = "/metrics"
	}
	if c.SettledInterval <= 0 {
		c.SettledInterval = 30 * time.Second
	}
	c.SettledInterval = max(c.SettledInterval, c.Interval)
	return c
}

// Validate names the first invalid field. Zero values are valid.
func (c Config) Validate() error {
	switch {
	case c.Interval < 0:
		return fmt.Errorf("modelmetrics: interval must be positive, got %v", c.Interval)
	case c.Timeout < 0:
		return fmt.Errorf("modelmetrics: timeout must be positive, got %v", c.Timeout)
	case c.MinRefresh < 0:
		return fmt.Errorf("modelmetrics: min_refresh must be positive, got %v", c.MinRefresh)
	case c.Staleness < 0:
		return fmt.Errorf("modelmetrics: staleness must be positive, got %v", c.Staleness)
	case c.MaxBackoff < 0:
		return fmt.Errorf("modelmetrics: max_backoff must be positive, got %v", c.MaxBackoff)
	case c.Path != "" && c.Path[0] != '/':
		return fmt.Errorf("modelmetrics: path must start with /, got %q", c.Path)
	}
	return nil
}
