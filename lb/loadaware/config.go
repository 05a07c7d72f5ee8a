package loadaware

import (
	"fmt"
	"math"
	"time"
)

// Config holds the scorers' weights and parameters. Zero values take the
// defaults (WithDefaults); Validate names the first bad field.
type Config struct {
	// Weights of the enabled scorers; a scorer not listed (or weighted 0)
	// is off. Nil: the Preset's weights, or DefaultWeights without one.
	Weights map[string]float64
	// Preset names a set of weights used when Weights is nil: "heimdall"
	// is the seed's five scorers at 1. Explicit weights override it.
	Preset string
	// Threshold of the load_aware scorer: waiting requests at which a
	// replica counts as overloaded (default 128).
	Threshold float64
	// RequestTimeout after which an unanswered request stops counting for
	// active_request (default 2m).
	RequestTimeout time.Duration
	// LRUSize bounds the replicas no_hit_lru tracks (default 1024).
	LRUSize int
	// MaxNumEndpoints the picker returns: the best, then the fallback
	// order used on retries (default 1).
	MaxNumEndpoints int
	// HotPrefixChars: a request whose prompt shares at least this many
	// leading characters with one already routed counts as hot for
	// no_hit_lru (default 64).
	HotPrefixChars int
	// SLO turns on adaptive mode: while the pool's time to first byte
	// (EWMA) is above it, weight shifts from the affinity scorers
	// (session_affinity, no_hit_lru) to the load scorers, step by step
	// per completed request, and back once it recovers. 0: off.
	SLO          time.Duration
	AdaptiveStep float64 // per completed request (default 0.05)
}

// DefaultWeights are the scorers used when none are configured: Sluice's
// exact in-flight count and in-flight tokens. On Heimdall's heavy/short
// workload over batching replicas they beat the seed's five scorers, which
// rank replicas by scraped queue lengths that lag a burst and, with
// no_hit_lru, rotate unique prompts like round robin (bench/results/
// heavy-short-mix.md, heimdall-published.md).
func DefaultWeights() map[string]float64 {
	return map[string]float64{ActiveRequest: 1, ActiveTokens: 1}
}

// HeimdallWeights is the seed's example: the five Heimdall scorers, equal.
func HeimdallWeights() map[string]float64 {
	return map[string]float64{Queue: 1, LoadAware: 1, ActiveRequest: 1, SessionAffinity: 1, NoHitLRU: 1}
}

// PresetHeimdall names HeimdallWeights.
const PresetHeimdall = "heimdall"

// Presets lists the known presets.
var Presets = []string{PresetHeimdall}

// presetWeights returns a preset's weights; "" is DefaultWeights.
func presetWeights(name string) (map[string]float64, bool) {
	switch name {
	case "":
		return DefaultWeights(), true
	case PresetHeimdall:
		return HeimdallWeights(), true
	}
	return nil, false
}

// WithDefaults fills zero fields. An unknown preset leaves Weights nil
// for Validate to refuse.
func (c Config) WithDefaults() Config {
	if c.Weights == nil {
		c.Weights, _ = presetWeights(c.Preset)
	}
	if c.Threshold == 0 {
		c.Threshold = 128
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 2 * time.Minute
	}
	if c.LRUSize == 0 {
		c.LRUSize = 1024
	}
	if c.MaxNumEndpoints == 0 {
		c.MaxNumEndpoints = 1
	}
	if c.HotPrefixChars == 0 {
		c.HotPrefixChars = 64
	}
	if c.AdaptiveStep == 0 {
		c.AdaptiveStep = 0.05
	}
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if _, ok := presetWeights(c.Preset); !ok {
		return fmt.Errorf("preset: unknown preset %q (known: %v)", c.Preset, Presets)
	}
	known := map[string]bool{}
	for _, s := range AllScorers {
		known[s] = true
	}
	enabled := 0
	for name, w := range c.Weights {
		if !known[name] {
			return fmt.Errorf("unknown scorer %q (known: %v)", name, AllScorers)
		}
		if math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
			return fmt.Errorf("scorer %s: weight must be a finite number >= 0, got %g", name, w)
		}
		if w > 0 {
			enabled++
		}
	}
	switch {
	case c.Weights != nil && enabled == 0:
		return fmt.Errorf("at least one scorer must have a weight above 0")
	case !(c.Threshold >= 1) || math.IsInf(c.Threshold, 0):
		return fmt.Errorf("threshold must be >= 1, got %g", c.Threshold)
	case c.RequestTimeout < 0:
		return fmt.Errorf("request_timeout must be positive, got %s", c.RequestTimeout)
	case c.LRUSize < 1:
		return fmt.Errorf("lru_size must be >= 1, got %d", c.LRUSize)
	case c.MaxNumEndpoints < 1:
		return fmt.Errorf("max_num_endpoints must be >= 1, got %d", c.MaxNumEndpoints)
	case c.HotPrefixChars < 1:
		return fmt.Errorf("hot_prefix_chars must be >= 1, got %d", c.HotPrefixChars)
	case c.SLO < 0:
		return fmt.Errorf("slo must be positive, got %s", c.SLO)
	case !(c.AdaptiveStep > 0 && c.AdaptiveStep <= 1):
		return fmt.Errorf("adaptive_step must be in (0, 1], got %g", c.AdaptiveStep)
	}
	return nil
}
