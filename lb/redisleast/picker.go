package redisleast

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// Settings, live or not. Configure applies in place, without a new
// connection or identity, every setting but the connection's:
//
//	live (Configure):       max_inflight, lease_ttl, breaker_failures,
//	                        breaker_backoff, read_timeout, pending_max,
//	                        queue_timeout (while the mode stays on or off)
//	new store (a new key):  redis addresses, username, password, db, tls,
//	                        ca_file, dial_timeout, key_prefix, instance_id,
//	                        queueing mode on/off (queue_timeout 0 ↔ > 0)
//
// ConnectionKey tells the two apart: equal keys, same store.

// ConnectionKey identifies the settings that need a new Store when they
// change. The password enters as a hash: the key may be logged or shown.
func (c Config) ConnectionKey() string {
	c = c.WithDefaults()
	pw := ""
	if c.Password != "" {
		sum := sha256.Sum256([]byte(c.Password))
		pw = hex.EncodeToString(sum[:8])
	}
	return strings.Join([]string{strings.Join(c.Addrs, ","), c.Username, pw, strconv.Itoa(c.DB),
		strconv.FormatBool(c.TLS), c.CAFile, c.DialTimeout.String(), c.KeyPrefix, c.InstanceID,
		strconv.FormatBool(c.QueueTimeout > 0)}, "|")
}

// conf is the configuration in force.
func (s *Store) conf() Config { return *s.cfgp.Load() }

// Config returns the configuration in force.
func (s *Store) Config() Config { return s.conf() }

// Configure applies cfg's live settings in place. cfg must have the same
// ConnectionKey as the store's: a different one needs a new Store.
func (s *Store) Configure(cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.ConnectionKey() != s.conf().ConnectionKey() {
		return fmt.Errorf("redis %v: connection settings differ; they need a new store", cfg.Addrs)
	}
	s.cfgp.Store(&cfg)
	s.br.mu.Lock()
	s.br.limit = cfg.BreakerFailures
	s.br.mu.Unlock()
	s.pend.mu.Lock()
	s.pend.max = cfg.PendingMax
	s.pend.mu.Unlock()
	return nil
}

// The store as the global least-request policy's lb.Picker.

// syncTimeout bounds SetReplicas' round trip to Redis.
const syncTimeout = 2 * time.Second

// SetReplicas implements lb.Picker: Sync, bounded. A failure (Redis away)
// is kept for SyncErr; the store replays the set when Redis answers.
func (s *Store) SetReplicas(addrs []string) {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	err := s.Sync(ctx, addrs)
	s.syncErr.Store(&err)
}

// SyncErr is the last SetReplicas' error, if any.
func (s *Store) SyncErr() error {
	if p := s.syncErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Pick implements lb.Picker: Select over the replicas of the last
// SetReplicas (or Sync) less req.Unavailable.
func (s *Store) Pick(ctx context.Context, req *lb.Request) (lb.Lease, error) {
	s.mu.Lock()
	replicas := s.last
	s.mu.Unlock()
	if len(replicas) == 0 {
		return nil, lb.ErrNoBackends
	}
	cands := replicas
	if len(req.Unavailable)+len(req.Avoid) > 0 {
		cands = make([]string, 0, len(replicas))
		for _, r := range replicas {
			if !req.Excluded(r) {
				cands = append(cands, r)
			}
		}
		if len(cands) == 0 {
			return nil, lb.ErrAllDown
		}
	}
	l, err := s.Select(ctx, cands)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// InFlight implements lb.Picker: this instance's own leases per replica
// (the pool-wide counts are in Counts and the metrics).
func (s *Store) InFlight() map[string]int {
	out := map[string]int{}
	s.local.mu.RLock()
	defer s.local.mu.RUnlock()
	for a, c := range s.local.m {
		if n := c.Load(); n > 0 {
			out[a] = int(n)
		}
	}
	return out
}

// Replica implements lb.Lease.
func (l *Lease) Replica() string { return l.Addr }

var (
	_ lb.Picker = (*Store)(nil)
	_ lb.Lease  = (*Lease)(nil)
)
