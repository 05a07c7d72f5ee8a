package flow

import (
	"fmt"
	"time"

	"github.com/sluice-router/sluice/flow/policies"
)

// Config mirrors the flowControl section of the seed's EndpointPickerConfig
// (names in snake_case, as in the Caddyfile). Zero values are replaced by
// defaults in WithDefaults; Validate rejects what makes no sense and names
// the field. Quantities (max_bytes, max_requests) are plain integers here:
// the adapter reads "10Gi" or "1k" with ParseQuantity.
type Config struct {
	// MaxRequests and MaxBytes bound what is queued across all bands
	// (maxRequests, maxBytes). 0 means no global limit. A request's bytes
	// are its body size.
	MaxRequests int64
	MaxBytes    int64
	// DefaultTTL bounds a request's time in the queue when its band sets
	// none (defaultRequestTTL).
	DefaultTTL time.Duration
	// Bands configure priority levels (priorityBands). A priority with no
	// band here gets one with the default limits and policies on first use.
	Bands []BandConfig
	// Detector configures the saturation detector (saturationDetector).
	Detector DetectorConfig
	// Objectives maps x-gateway-inference-objective values to priorities
	// (the seed's InferenceObjective resources).
	Objectives Objectives
	// PollInterval is how often the controller re-asks the detector while
	// requests wait: the utilization detector's signal changes without any
	// event the controller sees.
	PollInterval time.Duration
}

// BandConfig is one priority band (an entry of priorityBands).
type BandConfig struct {
	// Priority is the band's external priority; higher is served first,
	// negative is sheddable. Unique across bands.
	Priority int
	// Name labels the band in snapshots (default "priority-<n>").
	Name string
	// MaxRequests and MaxBytes bound the band's queue (maxRequests,
	// maxBytes), isolating it from the others. MaxRequests 0 (the
	// default) bounds the queue by the pool's capacity: see BandQueueLimit.
	MaxRequests int64
	MaxBytes    int64
	// Fairness picks the flow (fairnessPolicyRef): round_robin or global_strict.
	Fairness string
	// Ordering picks the request within a flow (orderingPolicyRef): fcfs,
	// edf or slo_deadline.
	Ordering string
	// TTL overrides DefaultTTL for this band.
	TTL time.Duration
}

// DetectorConfig selects and tunes the saturation detector.
type DetectorConfig struct {
	// Type is "utilization" (utilization-detector, the seed's default) or
	// "concurrency" (concurrency-detector).
	Type string

	// Concurrency detector (maxConcurrency, concurrencyMode, headroom,
	// maxTokenConcurrency). MaxConcurrency and MaxTokenConcurrency are per
	// replica.
	MaxConcurrency      int64
	ConcurrencyMode     string // "requests" or "tokens"
	MaxTokenConcurrency int64
	// Headroom is the burst allowance above MaxConcurrency (or the
	// utilization thresholds) a per-replica filter may grant, in [0, 1].
	// As in the seed's detectors it does not move the pool gate.
	Headroom float64

	// Utilization detector (queueDepthThreshold, kvCacheUtilThreshold,
	// metricsStalenessThreshold).
	QueueDepthThreshold float64
	KVCacheThreshold    float64
	// MetricsStaleness, when set, also treats a sample older than this as
	// stale. 0 leaves staleness to the source (modelmetrics: 3 scrape
	// intervals), whose interval the seed's 200ms default would not fit.
	MetricsStaleness time.Duration
}

// Detector types and concurrency modes.
const (
	DetectorUtilization = "utilization"
	DetectorConcurrency = "concurrency"
	ModeRequests        = "requests"
	ModeTokens          = "tokens"
)

// Defaults, from the Gateway API Inference Extension where it has them.
// Two depart from it so that a configuration that sets nothing protects
// tenants from each other: fairness is round_robin (the seed's
// global_strict serves a flood before a quiet tenant that came later), and
// a band's queue is bounded by the pool's capacity rather than 5000
// requests (which queued a flood for the whole TTL instead of refusing it).
const (
	DefaultTTL          = 60 * time.Second
	DefaultPollInterval = 50 * time.Millisecond
	// A band with no max_requests queues at most DefaultBandQueueFactor ×
	// the pool's capacity (the requests it serves at once), and never fewer
	// than DefaultBandMinRequests: the queue then holds a few service
	// times of work, enough to keep every replica busy through a burst,
	// and a flood beyond it is refused with 429 at once.
	DefaultBandQueueFactor = 4
	DefaultBandMinRequests = 8

	DefaultBandMaxBytes        = 1_000_000_000
	DefaultFairness            = policies.RoundRobin
	DefaultOrdering            = policies.FCFS
	DefaultDetector            = DetectorUtilization
	DefaultMaxConcurrency      = 100
	DefaultMaxTokenConcurrency = 1_000_000
	DefaultQueueDepthThreshold = 5
	DefaultKVCacheThreshold    = 0.8
)

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.DefaultTTL == 0 {
		c.DefaultTTL = DefaultTTL
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	c.Bands = append([]BandConfig(nil), c.Bands...)
	for i := range c.Bands {
		c.Bands[i] = c.Bands[i].withDefaults(c.DefaultTTL)
	}
	d := &c.Detector
	if d.Type == "" {
		d.Type = DefaultDetector
	}
	if d.MaxConcurrency == 0 {
		d.MaxConcurrency = DefaultMaxConcurrency
	}
	if d.ConcurrencyMode == "" {
		d.ConcurrencyMode = ModeRequests
	}
	if d.MaxTokenConcurrency == 0 {
		d.MaxTokenConcurrency = DefaultMaxTokenConcurrency
	}
	if d.QueueDepthThreshold == 0 {
		d.QueueDepthThreshold = DefaultQueueDepthThreshold
	}
	if d.KVCacheThreshold == 0 {
		d.KVCacheThreshold = DefaultKVCacheThreshold
	}
	return c
}

// withDefaults fills a band; a band for an unconfigured priority is the
// zero BandConfig with only Priority set.
func (b BandConfig) withDefaults(ttl time.Duration) BandConfig {
	if b.Name == "" {
		b.Name = fmt.Sprintf("priority-%d", b.Priority)
	}
	if b.MaxBytes == 0 {
		b.MaxBytes = DefaultBandMaxBytes
	}
	if b.Fairness == "" {
		b.Fairness = DefaultFairness
	}
	if b.Ordering == "" {
		b.Ordering = DefaultOrdering
	}
	if b.TTL == 0 {
		b.TTL = ttl
	}
	return b
}

// Validate names the first bad field. It accepts a config before or after
// WithDefaults.
func (c Config) Validate() error {
	switch {
	case c.MaxRequests < 0:
		return fmt.Errorf("max_requests: must not be negative, got %d", c.MaxRequests)
	case c.MaxBytes < 0:
		return fmt.Errorf("max_bytes: must not be negative, got %d", c.MaxBytes)
	case c.DefaultTTL < 0:
		return fmt.Errorf("default_ttl: must be positive, got %v", c.DefaultTTL)
	case c.PollInterval < 0:
		return fmt.Errorf("poll_interval: must be positive, got %v", c.PollInterval)
	}
	seen := map[int]int{}
	for i, b := range c.Bands {
		if j, dup := seen[b.Priority]; dup {
			return fmt.Errorf("bands[%d].priority: %d is already used by bands[%d]", i, b.Priority, j)
		}
		seen[b.Priority] = i
		if err := b.validate(); err != nil {
			return fmt.Errorf("bands[%d].%w", i, err)
		}
	}
	if err := c.Detector.validate(); err != nil {
		return fmt.Errorf("detector.%w", err)
	}
	if err := c.Objectives.validate(); err != nil {
		return err
	}
	return nil
}

func (b BandConfig) validate() error {
	switch {
	case b.MaxRequests < 0:
		return fmt.Errorf("max_requests: must not be negative, got %d", b.MaxRequests)
	case b.MaxBytes < 0:
		return fmt.Errorf("max_bytes: must not be negative, got %d", b.MaxBytes)
	case b.TTL < 0:
		return fmt.Errorf("ttl: must be positive, got %v", b.TTL)
	}
	ord, fair := b.Ordering, b.Fairness
	if ord == "" {
		ord = DefaultOrdering
	}
	if fair == "" {
		fair = DefaultFairness
	}
	o, err := policies.NewOrdering(ord)
	if err != nil {
		return fmt.Errorf("ordering: %v", err)
	}
	if _, err := policies.NewFairness(fair, o); err != nil {
		return fmt.Errorf("fairness: %v", err)
	}
	return nil
}

func (d DetectorConfig) validate() error {
	switch {
	case d.Type != "" && d.Type != DetectorUtilization && d.Type != DetectorConcurrency:
		return fmt.Errorf("type: want %q or %q, got %q", DetectorUtilization, DetectorConcurrency, d.Type)
	case d.MaxConcurrency < 0:
		return fmt.Errorf("max_concurrency: must be positive, got %d", d.MaxConcurrency)
	case d.ConcurrencyMode != "" && d.ConcurrencyMode != ModeRequests && d.ConcurrencyMode != ModeTokens:
		return fmt.Errorf("concurrency_mode: want %q or %q, got %q", ModeRequests, ModeTokens, d.ConcurrencyMode)
	case d.MaxTokenConcurrency < 0:
		return fmt.Errorf("max_token_concurrency: must be positive, got %d", d.MaxTokenConcurrency)
	case !(d.Headroom >= 0 && d.Headroom <= 1): // also rejects NaN
		return fmt.Errorf("headroom: want a fraction in [0, 1], got %v", d.Headroom)
	case !(d.QueueDepthThreshold >= 0) || d.QueueDepthThreshold > 1e9:
		return fmt.Errorf("queue_depth_threshold: must be positive, got %v", d.QueueDepthThreshold)
	case !(d.KVCacheThreshold >= 0 && d.KVCacheThreshold <= 1):
		return fmt.Errorf("kv_cache_threshold: want a fraction in (0, 1], got %v", d.KVCacheThreshold)
	case d.MetricsStaleness < 0:
		return fmt.Errorf("metrics_staleness: must be positive, got %v", d.MetricsStaleness)
	}
	return nil
}

// BandQueueLimit is the most requests a band queues: its max_requests if
// set, else DefaultBandQueueFactor × capacity (requests the pool serves at
// once, as the detector sees it), at least DefaultBandMinRequests.
func BandQueueLimit(b BandConfig, capacity int64) int64 {
	if b.MaxRequests > 0 {
		return b.MaxRequests
	}
	return max(DefaultBandQueueFactor*capacity, DefaultBandMinRequests)
}

// BandName is the name of the band requests of priority p go to
// (configured, or "priority-<p>").
func (c Config) BandName(p int) string { return c.band(p).withDefaults(0).Name }

// band returns the resolved config of priority p: the configured band, or
// a default one.
func (c Config) band(p int) BandConfig {
	for _, b := range c.Bands {
		if b.Priority == p {
			return b
		}
	}
	return BandConfig{Priority: p}.withDefaults(c.DefaultTTL)
}
