package caddymodule

import (
	"net/http"
	"sort"
	"time"

	"github.com/sluice-router/sluice/internal/version"
	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/tracker"
)

// healthReport is the JSON body of GET /_custom_router/health.
type healthReport struct {
	OK   bool   `json:"ok"`
	Pool string `json:"pool"`
	// Version is Sluice's release version (internal/version).
	Version    string          `json:"version"`
	Managed    bool            `json:"backends_set"`
	QueueDepth int             `json:"queue_depth"`
	Backends   []backendHealth `json:"backends"`
	// GlobalQueue is global_redis_least's queue, in its queueing mode.
	GlobalQueue *globalQueueHealth `json:"global_queue,omitempty"`
	// Settings maps each Sluice module serving the pool to the settings
	// its shared state runs with now (what the last loaded config gave).
	Settings map[string]any `json:"settings,omitempty"`
}

type backendHealth struct {
	Addr        string  `json:"addr"`
	URL         string  `json:"url,omitempty"`
	EWMALatency float64 `json:"ewma_latency"`
	// queued_least_latency's: its streams' first-byte EWMA (seconds) and
	// the learned concurrency limit (slots_from learned: its floor).
	StreamEWMA       *float64 `json:"ewma_first_byte_stream,omitempty"`
	ConcurrencyLimit *float64 `json:"concurrency_limit,omitempty"`
	Tried            bool     `json:"tried"`
	InFlight         int      `json:"in_flight"`
	// Parallelism is the requests a queueing policy takes the replica to
	// serve at once (configured, or learned).
	Parallelism int `json:"parallelism,omitempty"`
	// SlotsFrom says what decides Parallelism (queued_least_latency):
	// engine, engine_probe, learned or pinned.
	SlotsFrom  string `json:"slots_from,omitempty"`
	Down       bool   `json:"down"`
	Draining   bool   `json:"draining,omitempty"`
	Dispatched uint64 `json:"dispatched"`
	Failures   uint64 `json:"failures"`
	// The replica's own metrics, when a policy scrapes them.
	Metrics *replicaMetrics `json:"metrics,omitempty"`
}

type replicaMetrics struct {
	Freshness    string   `json:"freshness"`
	Waiting      *float64 `json:"waiting,omitempty"`
	Running      *float64 `json:"running,omitempty"`
	KVCacheUsage *float64 `json:"kv_cache_usage,omitempty"`
	AgeSeconds   *float64 `json:"age_seconds,omitempty"`
	Error        string   `json:"error,omitempty"`
	// While scrapes fail: how many in a row, and the seconds until the
	// next one (the scraper backs off).
	ConsecutiveFailures int      `json:"consecutive_failures,omitempty"`
	NextScrapeSeconds   *float64 `json:"next_scrape_seconds,omitempty"`
}

// stateHealth is what one shared state tells the health report about its
// pool (observable.Health). The report merges the states of every module
// serving the pool without naming any of them.
type stateHealth struct {
	// QueueDepth is the requests waiting in the state's own queue.
	QueueDepth int
	// Replicas is the state's view of each replica, draining ones (gone
	// from the set, requests still in flight) marked; Detail says how much
	// it knows. The report shows the most detailed view among the pool's
	// states (on a tie, the first module by name).
	Replicas []backendHealth
	Detail   healthDetail
	// Metrics, if set, scrapes the replicas' own metrics, shown per replica.
	Metrics *modelmetrics.Scraper
	// GlobalQueue is a queue the pool's instances share (global_redis_least).
	GlobalQueue *globalQueueHealth
}

// globalQueueHealth is a queue shared by the pool's instances through
// Redis: its length, read from Redis when health is asked (absent when
// the read failed: Error says why), and this instance's requests in it.
type globalQueueHealth struct {
	Length  *int64 `json:"length,omitempty"`
	Waiting int    `json:"waiting"`
	Error   string `json:"error,omitempty"`
}

// healthDetail ranks what a state knows of each replica.
type healthDetail int

const (
	noReplicas      healthDetail = iota
	inFlightOnly                 // its own in-flight counts
	leasesAndDown                // this instance's leases (not the pool's counts) and its passive health
	inFlightAndDown              // the pool's exact in-flight counts and passive health (down, failures)
	latencyAndSlots              // and latency, slots, dispatch counts
)

// trackerHealth is the view of a policy whose in-flight counts and
// passive health are an lb/tracker.
func trackerHealth(tr *tracker.Tracker) stateHealth {
	h := stateHealth{Replicas: []backendHealth{}, Detail: inFlightAndDown}
	for _, r := range tr.Snapshot() {
		h.Replicas = append(h.Replicas, backendHealth{Addr: r.Addr, InFlight: r.InFlight, Down: r.Down,
			Failures: r.Failures, Draining: !r.Present})
	}
	return h
}

// inFlightHealth is the view of a policy that knows only its in-flight
// counts (lb.Picker.InFlight).
func inFlightHealth(inFlight map[string]int) stateHealth {
	h := stateHealth{Replicas: []backendHealth{}, Detail: inFlightOnly}
	for addr, n := range inFlight {
		h.Replicas = append(h.Replicas, backendHealth{Addr: addr, InFlight: n})
	}
	return h
}

func health(name string) healthReport {
	// Looked up, not lb.GetPool: that creates the pool, and a GET of the
	// admin API for any name (a typo, a probe) would leave one behind,
	// listed by /sluice/pools, per name asked.
	var set []lb.Backend
	var managed bool
	if p, ok := lb.LookupPool(name); ok {
		set, managed = p.Backends()
	}
	rep := healthReport{OK: true, Pool: name, Version: version.Version, Managed: managed, Backends: []backendHealth{}, Settings: map[string]any{}}
	states := liveStatesOf(name)
	modules := make([]string, 0, len(states))
	for m := range states {
		modules = append(modules, m)
	}
	sort.Strings(modules)
	var view stateHealth
	var scraper *modelmetrics.Scraper
	for _, m := range modules {
		st := states[m]
		rep.Settings[m] = st.Settings()
		h := st.Health()
		rep.QueueDepth += h.QueueDepth
		if rep.GlobalQueue == nil {
			rep.GlobalQueue = h.GlobalQueue
		}
		if h.Detail > view.Detail {
			view = h
		}
		if scraper == nil {
			scraper = h.Metrics
		}
	}
	if !managed {
		// The policies pick among reverse_proxy's static upstreams.
		set = staticSet(states, modules)
	}
	rep.Backends = append(rep.Backends, merged(set, view.Replicas)...)
	if scraper != nil {
		for i := range rep.Backends {
			rep.Backends[i].Metrics = scrapedMetrics(scraper, rep.Backends[i].Addr)
		}
	}
	return rep
}

// merged is the report's replicas: the set, in its order, each with what
// view knows of it, then the replicas view knows draining (sorted): those
// it marks so (an address added back while its old requests drain has
// both entries), and those outside the set that still have requests in
// flight (a view that knows only in-flight counts marks none draining).
func merged(set []lb.Backend, view []backendHealth) []backendHealth {
	stats := make(map[string]backendHealth, len(view))
	var draining []backendHealth
	for _, bh := range view {
		if bh.Draining {
			draining = append(draining, bh)
		} else {
			stats[bh.Addr] = bh
		}
	}
	out := make([]backendHealth, 0, len(set))
	for _, b := range set {
		bh, ok := stats[b.Dial]
		if !ok {
			bh = backendHealth{Addr: b.Dial}
		}
		delete(stats, b.Dial)
		bh.URL = b.URL
		out = append(out, bh)
	}
	for _, bh := range stats {
		if bh.InFlight > 0 {
			bh.Draining = true
			draining = append(draining, bh)
		}
	}
	sort.Slice(draining, func(i, j int) bool { return draining[i].Addr < draining[j].Addr })
	return append(out, draining...)
}

// staticSource is implemented by the shared states that know the static
// upstreams (reverse_proxy's own list) they serve while their pool has no
// managed set.
type staticSource interface {
	staticUpstreams() []lb.Backend
}

// staticUpstreams are the upstreams the policy's last request brought
// (none before the first), at the URLs the policy reaches them.
func (st *policyState) staticUpstreams() []lb.Backend {
	if last := st.static.last.Load(); last != nil {
		return last.set
	}
	return nil
}

// staticUpstreams are those of the reverse_proxy the handler guards, as
// the running config fixed them.
func (st *flowState) staticUpstreams() []lb.Backend { return st.view.Load().static }

// staticSet is the pool's replicas while it has no managed set: every
// static upstream its states serve, the first module's (by name) first,
// each in reverse_proxy's order.
func staticSet(states map[string]sharedState, modules []string) []lb.Backend {
	var set []lb.Backend
	seen := map[string]bool{}
	for _, m := range modules {
		src, ok := states[m].(staticSource)
		if !ok {
			continue
		}
		for _, b := range src.staticUpstreams() {
			if !seen[b.Dial] {
				seen[b.Dial] = true
				set = append(set, b)
			}
		}
	}
	return set
}

// scrapedMetrics is what sc last read of the replica at addr.
func scrapedMetrics(sc *modelmetrics.Scraper, addr string) *replicaMetrics {
	st := sc.Stats(addr)
	smp := st.Sample
	m := &replicaMetrics{Freshness: st.Freshness.String(), ConsecutiveFailures: st.ConsecutiveFailures}
	if smp.Have.Waiting {
		m.Waiting = &smp.Waiting
	}
	if smp.Have.Running {
		m.Running = &smp.Running
	}
	if smp.Have.KVCache {
		m.KVCacheUsage = &smp.KVCacheUsage
	}
	if !smp.At.IsZero() {
		age := time.Since(smp.At).Seconds()
		m.AgeSeconds = &age
	}
	if smp.Err != nil {
		m.Error = smp.Err.Error()
	}
	if !st.NextScrape.IsZero() {
		in := max(time.Until(st.NextScrape), 0).Seconds()
		m.NextScrapeSeconds = &in
	}
	return m
}

func serveHealth(w http.ResponseWriter, r *http.Request, name string) {
	if onlyRead(w, r) {
		writeJSON(w, http.StatusOK, health(name))
	}
}
