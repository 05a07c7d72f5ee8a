package caddymodule

import (
	"context"
	"crypto/tls"
	"sync"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// kvCapacityInterval: an engine's KV cache size does not change while it
// runs, but it must be known by the first requests, which come as soon
// as the engines are up, often just after Sluice (a replica not up yet
// is tried again after this, backing off if it stays down). Once read,
// a replica is scraped every kvCapacitySettled, which only notices a
// restart with another size: an engine's /metrics is a large page
// rendered by its API server, every instance of Sluice reads it, and
// qll's and load_aware's scrapes already read it each second where they
// need its load.
const (
	kvCapacityInterval = time.Second
	kvCapacitySettled  = 30 * time.Second
)

// kvCapacity is cache_aware's source of each replica's KV cache size
// (with kv_events): its engine's metrics at <replica URL>/metrics
// (vLLM's cache_config_info, num_gpu_blocks × block_size; SGLang's
// max_total_num_tokens), so that a miss can fill the caches in
// proportion to their sizes from the first request on.
type kvCapacity struct{ s *modelmetrics.Scraper }

var _ cacheaware.Capacity = kvCapacity{}

func newKVCapacity() kvCapacity {
	return kvCapacity{s: modelmetrics.New(kvCapacityConfig(nil))}
}

// kvCapacityConfig is the scraper's config, reading https:// replicas
// with tlsCfg (the proxy's).
func kvCapacityConfig(tlsCfg *tls.Config) modelmetrics.Config {
	return modelmetrics.Config{Interval: kvCapacityInterval, SettledInterval: kvCapacitySettled,
		Settled: func(smp modelmetrics.Sample) bool { return smp.Have.KVTokens }, TLS: tlsCfg}
}

// setTLS makes the scrapes of https:// replicas use tlsCfg (the proxy's,
// when its config starts).
func (c kvCapacity) setTLS(tlsCfg *tls.Config) { c.s.Configure(kvCapacityConfig(tlsCfg)) }

// Tokens implements cacheaware.Capacity: the size last read, even when a
// later scrape failed (a size outlives a slow /metrics). A replica never
// read yet is asked for a scrape now (not before its back-off has
// passed): a request wants its size, so its engine is likely up.
func (c kvCapacity) Tokens(addr string) (int, bool) {
	smp, _ := c.s.Get(addr)
	if smp.At.IsZero() {
		c.s.RefreshTargets(addr)
		return 0, false
	}
	if !smp.Have.KVTokens {
		return 0, false
	}
	return smp.KVTokens, true
}

// SetBackends scrapes each replica at its URL.
func (c kvCapacity) SetBackends(set []lb.Backend) {
	targets := make(map[string]string, len(set))
	for _, b := range set {
		targets[b.Dial] = b.URL
	}
	c.s.SetTargets(targets)
}

// run scrapes until ctx ends, beside run (the picker's own loop).
func (c kvCapacity) run(run func(context.Context)) func(context.Context) {
	return func(ctx context.Context) {
		var wg sync.WaitGroup
		wg.Go(func() { c.s.Run(ctx) })
		run(ctx)
		wg.Wait()
	}
}

// fill adds each replica's known cache size to the kv_events health.
func (c kvCapacity) fill(s *KVEventsStats, addrs []string) {
	for _, a := range addrs {
		n, ok := c.Tokens(a)
		if !ok {
			continue
		}
		r, seen := s.Replicas[a]
		if !seen {
			r.Mode = "approximate"
		}
		r.Capacity = n
		s.Replicas[a] = r
	}
}
