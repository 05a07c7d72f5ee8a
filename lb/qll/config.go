// Package qll implements queued least latency: requests wait in one FIFO
// queue at the edge and are dispatched, late, to the replica with the
// lowest predicted latency, following Hugging Face's reference custom
// router and fixing what it gets wrong (see README "queued_least_latency").
package qll

import (
	"fmt"
	"time"

	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// Config holds the policy's knobs. Zero values are replaced by defaults in
// WithDefaults; Validate rejects what makes no sense.
type Config struct {
	// LatencyThreshold, when set, is the Hugging Face router's rule: a
	// replica still gets a new request while its predicted latency is at
	// or under it (a replica with a free slot always does). Zero (the
	// default) is adaptive: a replica gets a request only into a free
	// slot, the rest wait at the edge for the first slot to free. With a
	// threshold, a replica has one slot unless Parallelism says otherwise
	// (the reference's model, for which its users tuned the threshold).
	LatencyThreshold time.Duration
	// EWMAAlpha weighs each new latency sample (0 < alpha <= 1).
	EWMAAlpha float64
	// QueueMaxSize bounds the edge queue; when full, the oldest waiter is
	// evicted to make room (the reference's semantics). Negative means no
	// queue at all: a request that cannot be dispatched at once is refused.
	QueueMaxSize int
	// QueueTimeout bounds the time one request may wait in the queue.
	QueueTimeout time.Duration
	// MaxConcurrency caps requests in flight per replica (0: no cap).
	MaxConcurrency int
	// Parallelism, when set, pins how many requests a replica serves at
	// once without slowing down (its free slots; 1 for diffusion-like
	// servers, the batch size for LLM servers). Zero (the default) learns
	// it per replica (see concurrencyLimit).
	Parallelism int
	// MaxFails consecutive failures mark a replica down for FailDuration,
	// doubling on each further failure up to 16×.
	MaxFails     int
	FailDuration time.Duration
	// EngineMetrics sets how the replicas' own metrics are read (each at
	// http://<dial address><Path>): where a replica exports its queue
	// (vLLM, SGLang, TGI, Triton), it decides the replica's slots instead
	// of the learned limit (see engine.go). Only without Parallelism and
	// LatencyThreshold.
	EngineMetrics modelmetrics.Config
	// NoEngineMetrics turns that off: the learned limit alone decides.
	NoEngineMetrics bool
}

// Defaults, from the reference router where it has them.
const (
	DefaultEWMAAlpha    = 0.3
	DefaultQueueMaxSize = 1000
	DefaultQueueTimeout = 1200 * time.Second
	DefaultMaxFails     = 1
	DefaultFailDuration = 5 * time.Second
	maxBackoffFactor    = 16
)

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.EWMAAlpha == 0 {
		c.EWMAAlpha = DefaultEWMAAlpha
	}
	if c.QueueMaxSize == 0 {
		c.QueueMaxSize = DefaultQueueMaxSize
	}
	if c.QueueTimeout == 0 {
		c.QueueTimeout = DefaultQueueTimeout
	}
	if c.MaxFails == 0 {
		c.MaxFails = DefaultMaxFails
	}
	if c.FailDuration == 0 {
		c.FailDuration = DefaultFailDuration
	}
	c.EngineMetrics = c.EngineMetrics.WithDefaults()
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.LatencyThreshold < 0:
		return fmt.Errorf("latency_threshold must be positive, got %s", c.LatencyThreshold)
	case !(c.EWMAAlpha > 0 && c.EWMAAlpha <= 1): // also rejects NaN
		return fmt.Errorf("ewma_alpha must be in (0, 1], got %g", c.EWMAAlpha)
	case c.QueueTimeout < 0:
		return fmt.Errorf("queue_timeout must be positive, got %s", c.QueueTimeout)
	case c.MaxConcurrency < 0:
		return fmt.Errorf("max_concurrency must be >= 0, got %d", c.MaxConcurrency)
	case c.Parallelism < 0:
		return fmt.Errorf("parallelism must be >= 1 (or 0: learned), got %d", c.Parallelism)
	case c.MaxFails < 1:
		return fmt.Errorf("max_fails must be >= 1, got %d", c.MaxFails)
	case c.FailDuration < 0:
		return fmt.Errorf("fail_duration must be positive, got %s", c.FailDuration)
	}
	if err := c.EngineMetrics.Validate(); err != nil {
		return err
	}
	return nil
}
