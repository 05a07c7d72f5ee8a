package flow

import "github.com/sluice-router/sluice/lb/modelmetrics"

// ScraperLoads feeds the utilization detector from a modelmetrics.Scraper.
// replicas returns the pool's current dial addresses (the scraper's
// targets may lag behind a set-backends call; a replica it does not know
// is Unknown, hence saturated).
func ScraperLoads(s *modelmetrics.Scraper, replicas func() []string) LoadSource {
	return scraperLoads{s: s, replicas: replicas}
}

type scraperLoads struct {
	s        *modelmetrics.Scraper
	replicas func() []string
}

func (l scraperLoads) Replicas() []string { return l.replicas() }

func (l scraperLoads) Load(addr string) ReplicaLoad {
	v, f := l.s.Get(addr)
	return ReplicaLoad{
		Waiting:      v.Waiting,
		KVCacheUsage: v.KVCacheUsage,
		HaveWaiting:  v.Have.Waiting,
		HaveKVCache:  v.Have.KVCache,
		At:           v.At,
		Fresh:        f == modelmetrics.Fresh,
	}
}
