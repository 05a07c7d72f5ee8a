package kvevents

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-router/sluice/lb/streamrelay"
)

// Source is one pool's index and listener, for the collector.
type Source struct {
	Index    *Index
	Listener *Listener
	// Tokenize gives the engine tokenizers' counters (nil, or nil
	// answer: none).
	Tokenize func() *EngineStats
	// Relay gives the relay's counters (nil, or nil answer: none).
	Relay func() *streamrelay.Stats
}

// Collector exports every pool's KV-events counters and index size. It
// reads Stats at scrape time. Replica labels are the pool's replicas only
// (the listener drops events of other pods).
type Collector struct {
	sources                         func() map[string][]Source
	batches, events, gaps, restarts *prometheus.Desc
	drops, eventDrops               *prometheus.Desc
	guard, blocks, evicted          *prometheus.Desc
	last                            *prometheus.Desc
	tokLookups, tokRequests         *prometheus.Desc
	tokFailures, tokBytes           *prometheus.Desc
	relayPub, relayApplied          *prometheus.Desc
	relayDropped, relayConnected    *prometheus.Desc
	relayResets, relayOversize      *prometheus.Desc
	replays                         *prometheus.Desc
}

// NewCollector reports the sources returned by sources (pool name → its
// sources: a pool served on several sites has a listener on each). A
// pool's series add up its sources: one series per pool and replica,
// whichever sources know it.
func NewCollector(sources func() map[string][]Source) *Collector {
	pool := []string{"pool"}
	return &Collector{
		sources:  sources,
		batches:  prometheus.NewDesc("sluice_kv_events_batches_total", "Engine KV-event batches applied to the exact index.", pool, nil),
		events:   prometheus.NewDesc("sluice_kv_events_events_total", "Engine KV events (BlockStored, BlockRemoved, AllBlocksCleared) applied to the exact index; an event the index dropped (unknown_parent, too_many) is counted in sluice_kv_events_events_dropped_total only.", pool, nil),
		gaps:     prometheus.NewDesc("sluice_kv_events_gaps_total", "Sequence gaps: the publisher's entries were cleared (events were lost).", pool, nil),
		restarts: prometheus.NewDesc("sluice_kv_events_restarts_total", "Sequences that went back (a publisher restarted): its entries were cleared.", pool, nil),
		drops: prometheus.NewDesc("sluice_kv_events_dropped_total",
			"Event messages (batches) dropped whole, none of their events applied, by reason; single events dropped from a message otherwise applied are in sluice_kv_events_events_dropped_total.",
			[]string{"pool", "reason"}, nil),
		eventDrops: prometheus.NewDesc("sluice_kv_events_events_dropped_total",
			"Single events dropped from a message whose other events were applied, by reason (unknown_parent: stored on a block the index does not hold; too_many: the replica's sources, rank and medium, all taken; token_count; extra_keys and lora_id_only: held without keys; kv_group: of a KV-cache group not keyed, a hybrid model's sliding-window or mamba group; sparse_store: fewer blocks than its token ids span).",
			[]string{"pool", "reason"}, nil),
		guard:   prometheus.NewDesc("sluice_kv_events_connections_cut_total", "ZMQ connections the socket guard cut, by reason (refused, oversize, handshake_timeout, handshake_evicted: the oldest handshake in progress, cut for a newer connection over the limit of handshakes in progress).", []string{"pool", "reason"}, nil),
		blocks:  prometheus.NewDesc("sluice_kv_events_blocks", "Engine blocks the exact index holds per replica.", []string{"pool", "replica"}, nil),
		evicted: prometheus.NewDesc("sluice_kv_events_capacity_evicted_total", "Blocks dropped from the index by its size bounds.", pool, nil),
		last:    prometheus.NewDesc("sluice_kv_events_last_event_timestamp_seconds", "When the replica's last event batch was applied (Unix time).", []string{"pool", "replica"}, nil),
		tokLookups: prometheus.NewDesc("sluice_kv_events_tokenize_lookups_total",
			"Prompts looked up in the engine tokenizer's cache, by result (hit: the whole prompt's ids, prefix_hit: a cached prefix, miss: the tree decided).", []string{"pool", "result"}, nil),
		tokRequests: prometheus.NewDesc("sluice_kv_events_tokenize_requests_total", "Tokenize requests sent to the engines.", pool, nil),
		tokFailures: prometheus.NewDesc("sluice_kv_events_tokenize_failures_total",
			"Tokenize requests whose answer was not used, and misses not asked (busy), by reason.", []string{"pool", "reason"}, nil),
		tokBytes: prometheus.NewDesc("sluice_kv_events_tokenize_cache_bytes", "Bytes the engine tokenizer's cache holds.", pool, nil),
		relayPub: prometheus.NewDesc("sluice_kv_events_relay_published_total",
			"Event messages this instance's socket received and relayed to the pool's other instances through Redis.", pool, nil),
		relayApplied: prometheus.NewDesc("sluice_kv_events_relay_received_total",
			"Event messages other instances relayed that this instance read (then checked and applied as its socket's).", pool, nil),
		relayDropped: prometheus.NewDesc("sluice_kv_events_relay_dropped_total",
			"Event messages dropped unrelayed (buffer full while Redis was slow or away, or a payload over 1 MiB): the other instances see a gap.", pool, nil),
		relayConnected: prometheus.NewDesc("sluice_kv_events_relay_connected", "1 while the pool's KV-event stream in Redis answers.", pool, nil),
		relayResets: prometheus.NewDesc("sluice_kv_events_relay_resets_total",
			"Times the pool's KV-event stream was found reset under this instance's reader (deleted, emptied, or its ids below the last one read) and read again from its start.", pool, nil),
		relayOversize: prometheus.NewDesc("sluice_kv_events_relay_oversize_total",
			"Records read from the pool's KV-event stream and skipped for their size (over the record bound or 64 fields, or a reply over 16 MiB alone).", pool, nil),
		replays: prometheus.NewDesc("sluice_kv_events_replays_total",
			"Sequence gaps met on a publisher with a replay socket (kv_events_replay_port), by result (recovered: filled from the engine's buffer; too_old: the buffer no longer held the first lost message; failed: no or a bad answer, over the time or hold bounds, or no replay slot). too_old and failed clear as a gap without replay.",
			[]string{"pool", "result"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.batches, c.events, c.gaps, c.restarts, c.replays, c.drops, c.eventDrops, c.guard, c.blocks, c.evicted, c.last,
		c.tokLookups, c.tokRequests, c.tokFailures, c.tokBytes, c.relayPub, c.relayApplied, c.relayDropped, c.relayConnected, c.relayResets, c.relayOversize} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for pool, srcs := range c.sources() {
		p := sumSources(srcs)
		s := p.stats
		counter(c.batches, s.Batches, pool)
		counter(c.events, s.Events, pool)
		counter(c.gaps, s.Gaps, pool)
		counter(c.restarts, s.Restarts, pool)
		counter(c.replays, s.Replays.Recovered, pool, ReplayRecovered)
		counter(c.replays, s.Replays.TooOld, pool, ReplayTooOld)
		counter(c.replays, s.Replays.Failed, pool, ReplayFailed)
		counter(c.evicted, s.CapacityEvicted, pool)
		for _, r := range slices.Sorted(maps.Keys(s.Drops)) {
			counter(c.drops, s.Drops[r], pool, string(r))
		}
		for _, r := range slices.Sorted(maps.Keys(s.EventDrops)) {
			counter(c.eventDrops, s.EventDrops[r], pool, string(r))
		}
		if p.guard != nil {
			g := *p.guard
			counter(c.guard, g.RefusedConns, pool, "refused")
			counter(c.guard, g.OversizeFrames, pool, "oversize")
			counter(c.guard, g.HandshakeTimeouts, pool, "handshake_timeout")
			counter(c.guard, g.HandshakesEvicted, pool, "handshake_evicted")
		}
		if ts := p.tokenize; ts != nil {
			counter(c.tokLookups, ts.Hits, pool, "hit")
			counter(c.tokLookups, ts.PrefixHits, pool, "prefix_hit")
			counter(c.tokLookups, ts.Misses, pool, "miss")
			counter(c.tokRequests, ts.Requests, pool)
			for _, r := range []string{TokUnreachable, TokTimeout, TokStatus, TokTooLarge, TokTooMany, TokBadAnswer, TokBusy, TokNoReplica} {
				counter(c.tokFailures, ts.Failures[r], pool, r)
			}
			ch <- prometheus.MustNewConstMetric(c.tokBytes, prometheus.GaugeValue, float64(ts.Bytes), pool)
		}
		if rs := p.relay; rs != nil {
			counter(c.relayPub, rs.Published, pool)
			counter(c.relayApplied, rs.Applied, pool)
			counter(c.relayDropped, rs.Dropped, pool)
			counter(c.relayResets, rs.Resets, pool)
			counter(c.relayOversize, rs.Oversize, pool)
			conn := 0.0
			if rs.Connected {
				conn = 1
			}
			ch <- prometheus.MustNewConstMetric(c.relayConnected, prometheus.GaugeValue, conn, pool)
		}
		for name, r := range s.Replicas {
			ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(r.Blocks), pool, name)
			if !r.LastEvent.IsZero() {
				ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, float64(r.LastEvent.UnixNano())/1e9, pool, name)
			}
		}
	}
}

// poolSums is a pool's sources added up (nil: none had it).
type poolSums struct {
	stats    Stats
	guard    *GuardStats
	tokenize *EngineStats
	relay    *streamrelay.Stats
}

// sumSources adds up a pool's sources: counters and blocks summed, the
// latest last event, the relay connected only if every one is.
func sumSources(srcs []Source) poolSums {
	var p poolSums
	p.stats.Drops = map[Reason]uint64{}
	p.stats.EventDrops = map[Reason]uint64{}
	p.stats.Replicas = map[string]ReplicaStats{}
	for _, src := range srcs {
		s := src.Index.Stats()
		t := &p.stats
		t.Batches += s.Batches
		t.Events += s.Events
		t.Gaps += s.Gaps
		t.Restarts += s.Restarts
		t.Replays.Recovered += s.Replays.Recovered
		t.Replays.TooOld += s.Replays.TooOld
		t.Replays.Failed += s.Replays.Failed
		t.CapacityEvicted += s.CapacityEvicted
		for r, n := range s.Drops {
			t.Drops[r] += n
		}
		for r, n := range s.EventDrops {
			t.EventDrops[r] += n
		}
		for name, r := range s.Replicas {
			o := t.Replicas[name]
			o.Blocks += r.Blocks
			if r.LastEvent.After(o.LastEvent) {
				o.LastEvent = r.LastEvent
			}
			t.Replicas[name] = o
		}
		if src.Listener != nil {
			g := src.Listener.GuardStats()
			if p.guard == nil {
				p.guard = &GuardStats{}
			}
			p.guard.RefusedConns += g.RefusedConns
			p.guard.OversizeFrames += g.OversizeFrames
			p.guard.HandshakeTimeouts += g.HandshakeTimeouts
			p.guard.HandshakesEvicted += g.HandshakesEvicted
		}
		if src.Tokenize != nil {
			if ts := src.Tokenize(); ts != nil {
				if p.tokenize == nil {
					p.tokenize = &EngineStats{}
				}
				p.tokenize.Add(*ts)
			}
		}
		if src.Relay != nil {
			if rs := src.Relay(); rs != nil {
				if p.relay == nil {
					p.relay = &streamrelay.Stats{Connected: true}
				}
				p.relay.Published += rs.Published
				p.relay.Applied += rs.Applied
				p.relay.Dropped += rs.Dropped
				p.relay.Resets += rs.Resets
				p.relay.Oversize += rs.Oversize
				p.relay.Connected = p.relay.Connected && rs.Connected
			}
		}
	}
	return p
}
