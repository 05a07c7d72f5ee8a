package flow

import "time"

// ReplicaLoad is one replica's own view of its load, as its metrics
// endpoint last reported it.
type ReplicaLoad struct {
	Waiting      float64 // requests queued on the replica
	KVCacheUsage float64 // fraction of the KV cache in use, 0..1
	// HaveWaiting and HaveKVCache say which values the server exports; a
	// missing one is not read as idle.
	HaveWaiting, HaveKVCache bool
	// At is when the values were read; Fresh is the source's own verdict
	// (false: never scraped, last scrape failed, or too old).
	At    time.Time
	Fresh bool
}

// LoadSource is what the utilization detector reads: the pool's replicas
// and their latest load. ScraperLoads adapts lb/modelmetrics.Scraper.
type LoadSource interface {
	Replicas() []string
	Load(addr string) ReplicaLoad
}

// UtilizationDetector is the seed's utilization-detector (its default):
// closed-loop, from the replicas' own telemetry. Each replica scores its
// most constrained resource,
//
//	score = max(waiting / queue_depth_threshold, kv_cache_usage / kv_cache_threshold)
//
// so a replica is saturated (score ≥ 1) when waiting ≥ queue_depth_threshold
// or KV use ≥ kv_cache_threshold; a replica whose metrics are stale or
// unknown scores 1 (it never looks idle). The pool's saturation is the
// unweighted average of the scores, each counted at most 1, and 1 with no
// replica: the gate closes only when every replica is saturated (or stale
// or unknown). The seed averages uncapped scores, so one replica far over
// its thresholds could close the gate while the others were idle (20
// waiting at threshold 5 scores 4; with three idle replicas the average is
// 1) and every request waited at the edge, though the load-balancing
// policy behind flow control sends work to the replicas with room. Score
// stays uncapped: it says how far over its thresholds a replica is.
type UtilizationDetector struct {
	queueDepth, kvCache float64
	staleness           time.Duration
	src                 LoadSource
	now                 func() time.Time
}

// NewUtilizationDetector builds the detector from cfg (defaults applied).
// clock may be nil (real time); it matters only with MetricsStaleness.
func NewUtilizationDetector(cfg DetectorConfig, src LoadSource, clock Clock) *UtilizationDetector {
	cfg = Config{Detector: cfg}.WithDefaults().Detector
	if clock == nil {
		clock = realClock{}
	}
	return &UtilizationDetector{
		queueDepth: cfg.QueueDepthThreshold,
		kvCache:    cfg.KVCacheThreshold,
		staleness:  cfg.MetricsStaleness,
		src:        src,
		now:        clock.Now,
	}
}

// Saturation implements SaturationDetector; in-flight counts are not used.
func (d *UtilizationDetector) Saturation(InFlight) Verdict {
	return Verdict{Load: d.load()}
}

// load is the average of the replicas' scores, each capped at 1 (a full
// replica counts as full, never more), and 1 with no replica. It reaches 1
// only when every replica is saturated.
func (d *UtilizationDetector) load() float64 {
	addrs := d.src.Replicas()
	if len(addrs) == 0 {
		return 1
	}
	now := d.now()
	sum := 0.0
	for _, a := range addrs {
		sum += min(d.Score(d.src.Load(a), now), 1)
	}
	return sum / float64(len(addrs))
}

// Score is one replica's saturation score at time now, not capped: above
// 1, it says how far over its thresholds the replica is (load caps it).
func (d *UtilizationDetector) Score(l ReplicaLoad, now time.Time) float64 {
	if !l.Fresh || !(l.HaveWaiting || l.HaveKVCache) || (d.staleness > 0 && now.Sub(l.At) > d.staleness) {
		return 1
	}
	s := 0.0
	if l.HaveWaiting {
		s = l.Waiting / d.queueDepth
	}
	if l.HaveKVCache {
		s = max(s, l.KVCacheUsage/d.kvCache)
	}
	return s
}
