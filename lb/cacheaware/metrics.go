package cacheaware

import "github.com/prometheus/client_golang/prometheus"

// Collector exports every pool's tree size and decision counters. It reads
// Stats at scrape time, so there is no state to keep in sync.
type Collector struct {
	routers                 func() map[string]*Router
	decisions, chars, nodes *prometheus.Desc
	evicted, exactHits      *prometheus.Desc
	affinityHits, moves     *prometheus.Desc
}

// NewCollector reports the routers returned by routers (pool name → router).
func NewCollector(routers func() map[string]*Router) *Collector {
	pool := []string{"pool"}
	return &Collector{
		routers:   routers,
		decisions: prometheus.NewDesc("sluice_cache_aware_decisions_total", "cache_aware picks by reason (cache_hit, miss, imbalance).", []string{"pool", "reason"}, nil),
		chars:     prometheus.NewDesc("sluice_cache_aware_tree_chars", "Characters (Unicode code points) stored in the pool's approximate radix trees.", pool, nil),
		nodes:     prometheus.NewDesc("sluice_cache_aware_tree_nodes", "Nodes in the pool's approximate radix trees.", pool, nil),
		evicted:   prometheus.NewDesc("sluice_cache_aware_evicted_chars_total", "Characters freed from the trees by LRU eviction.", pool, nil),
		exactHits: prometheus.NewDesc("sluice_cache_aware_exact_hits_total", "cache_hit picks the exact index (engine KV events) chose.", pool, nil),
		affinityHits: prometheus.NewDesc("sluice_cache_aware_affinity_hits_total",
			"cache_hit picks with kv_events where no engine held enough of the prompt and the tree's holder (the prefix's home) got it.", pool, nil),
		moves: prometheus.NewDesc("sluice_cache_aware_moves_total",
			"cache_hit picks with kv_events that sent a prompt off its home, whose engine kept evicting what it was sent, to the least pressured replica.", pool, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.decisions
	ch <- c.chars
	ch <- c.nodes
	ch <- c.evicted
	ch <- c.exactHits
	ch <- c.affinityHits
	ch <- c.moves
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for pool, r := range c.routers() {
		s := r.Stats()
		for _, d := range []struct {
			reason Reason
			n      uint64
		}{{CacheHit, s.Hits}, {Miss, s.Misses}, {Imbalance, s.Imbalanced}} {
			ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(d.n), pool, d.reason.String())
		}
		ch <- prometheus.MustNewConstMetric(c.chars, prometheus.GaugeValue, float64(s.Chars), pool)
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(s.Nodes), pool)
		ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(s.EvictedChars), pool)
		ch <- prometheus.MustNewConstMetric(c.exactHits, prometheus.CounterValue, float64(s.ExactHits), pool)
		ch <- prometheus.MustNewConstMetric(c.affinityHits, prometheus.CounterValue, float64(s.AffinityHits), pool)
		ch <- prometheus.MustNewConstMetric(c.moves, prometheus.CounterValue, float64(s.Moves), pool)
	}
}
