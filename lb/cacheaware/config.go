// Package cacheaware implements SGLang's cache-aware load balancing: one
// approximate radix tree per model remembers which replica recently served
// which request text, and a request goes to the replica holding the
// longest prefix of its text (its KV cache likely still has it), unless
// the pool is imbalanced, in which case load wins.
//
// The tree is "approximate" because it is the router's guess, from the
// requests it routed, not the replica's real cache state.
package cacheaware

import (
	"fmt"
	"math"
	"time"
)

// Config holds the policy's knobs, named after SGLang's. Zero values are
// replaced by defaults in WithDefaults; Validate rejects what makes no sense.
type Config struct {
	// CacheThreshold: a request whose best match rate (matched characters /
	// request characters) is above it goes to the replica with that match;
	// at or below, it is a miss. In [0, 1].
	CacheThreshold float64
	// BalanceAbsThreshold and BalanceRelThreshold: the pool is imbalanced
	// when max_load - min_load > abs AND max_load > rel * min_load; then the
	// least-loaded replica gets the request whatever the tree says.
	BalanceAbsThreshold int
	BalanceRelThreshold float64
	// MaxTreeSize bounds the characters (Unicode code points) of node text
	// stored across all models' trees of one Router. Shared prefixes count
	// once, however many replicas hold them. Never exceeded: inserts evict.
	MaxTreeSize int
	// EvictionInterval is how often Run trims the trees to the low-water
	// mark (see EvictOnce).
	EvictionInterval time.Duration
	// MissPolicy chooses the replica on a miss: "least_load" (the default,
	// what SGLang does now) or "smallest_tree" (the original router: the
	// replica holding the fewest characters).
	MissPolicy string
}

// Miss policies.
const (
	MissLeastLoad    = "least_load"
	MissSmallestTree = "smallest_tree"
)

// Defaults, from SGLang's router.
const (
	DefaultCacheThreshold      = 0.5
	DefaultBalanceAbsThreshold = 32
	DefaultBalanceRelThreshold = 1.0001
	DefaultMaxTreeSize         = 1 << 24
	DefaultEvictionInterval    = 60 * time.Second
	DefaultMissPolicy          = MissLeastLoad

	// maxMaxTreeSize keeps rune counts in int32 node fields.
	maxMaxTreeSize = math.MaxInt32
)

// WithDefaults returns c with zero fields set to their defaults. For the
// two knobs whose zero is a meaningful setting (cache_threshold 0: any
// match is a hit; balance_abs_threshold 0: any difference counts), the
// zero value still means "default", so an explicit zero is written as a
// negative number, which WithDefaults turns into 0.
func (c Config) WithDefaults() Config {
	switch {
	case c.CacheThreshold == 0:
		c.CacheThreshold = DefaultCacheThreshold
	case c.CacheThreshold < 0:
		c.CacheThreshold = 0
	}
	switch {
	case c.BalanceAbsThreshold == 0:
		c.BalanceAbsThreshold = DefaultBalanceAbsThreshold
	case c.BalanceAbsThreshold < 0:
		c.BalanceAbsThreshold = 0
	}
	if c.BalanceRelThreshold == 0 {
		c.BalanceRelThreshold = DefaultBalanceRelThreshold
	}
	if c.MaxTreeSize == 0 {
		c.MaxTreeSize = DefaultMaxTreeSize
	}
	if c.EvictionInterval == 0 {
		c.EvictionInterval = DefaultEvictionInterval
	}
	if c.MissPolicy == "" {
		c.MissPolicy = DefaultMissPolicy
	}
	return c
}

// Validate names the first bad field. Call it on WithDefaults' result.
func (c Config) Validate() error {
	switch {
	case !(c.CacheThreshold >= 0 && c.CacheThreshold <= 1): // also rejects NaN
		return fmt.Errorf("cache_threshold must be in [0,1], got %g", c.CacheThreshold)
	case c.BalanceAbsThreshold < 0:
		return fmt.Errorf("balance_abs_threshold must be >= 0, got %d", c.BalanceAbsThreshold)
	case !(c.BalanceRelThreshold >= 1) || math.IsInf(c.BalanceRelThreshold, 0):
		return fmt.Errorf("balance_rel_threshold must be a finite number >= 1, got %g", c.BalanceRelThreshold)
	case c.MaxTreeSize < 1 || c.MaxTreeSize > maxMaxTreeSize:
		return fmt.Errorf("max_tree_size must be in [1,%d], got %d", maxMaxTreeSize, c.MaxTreeSize)
	case c.EvictionInterval <= 0:
		return fmt.Errorf("eviction_interval must be positive, got %s", c.EvictionInterval)
	case c.MissPolicy != MissLeastLoad && c.MissPolicy != MissSmallestTree:
		return fmt.Errorf("miss_policy must be %s or %s, got %q", MissLeastLoad, MissSmallestTree, c.MissPolicy)
	}
	return nil
}

// lowWater is what the periodic eviction trims to: 7/8 of the bound, so
// that in steady state most inserts find room without evicting.
func (c Config) lowWater() int { return c.MaxTreeSize - c.MaxTreeSize/8 }
