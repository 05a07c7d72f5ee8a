package caddymodule

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/kvevents"
)

// kvEventsOptions are cache_aware's exact-index settings: engines publish
// their KV-cache events (vLLM --kv-events-config, SGLang, llm-d-inference-
// sim) to a ZMQ address Sluice binds; replicas whose events are fresh are
// scored by what their engine really holds, the others by the tree.
type kvEventsOptions struct {
	// KVEvents is the listen address, tcp://host:port (host * for every
	// interface). Engines dial it; a topic kv@<host:port>@<model> maps to
	// the replica with that dial address.
	KVEvents string `json:"kv_events,omitempty"`
	// KVEventsTokenizer says how Sluice gets a prompt's token ids, which
	// must be the engine's: llmd_sim (llm-d-inference-sim's dummy rule).
	// Required with kv_events: a wrong tokenizer would match nothing.
	KVEventsTokenizer string `json:"kv_events_tokenizer,omitempty"`
	// KVEventsFresh: a replica with no event batch for longer is scored by
	// the tree (default 30s).
	KVEventsFresh caddy.Duration `json:"kv_events_fresh,omitempty" sluice:"positive"`
}

// kvTokenizers are the values of kv_events_tokenizer.
var kvTokenizers = map[string]kvevents.Tokenizer{
	"llmd_sim": kvevents.SimTokenizer{},
}

func (o kvEventsOptions) enabled() bool { return o.KVEvents != "" }

func (o kvEventsOptions) validate() error {
	if !o.enabled() {
		if o.KVEventsTokenizer != "" || o.KVEventsFresh != 0 {
			return fmt.Errorf("kv_events_tokenizer and kv_events_fresh need kv_events")
		}
		return nil
	}
	if _, err := kvevents.ParseListenAddr(o.KVEvents); err != nil {
		return err
	}
	if _, ok := kvTokenizers[o.KVEventsTokenizer]; !ok {
		return fmt.Errorf("kv_events_tokenizer %q: want llmd_sim (the only tokenizer Sluice knows the engine's ids for so far)", o.KVEventsTokenizer)
	}
	if o.KVEventsFresh < 0 {
		return fmt.Errorf("kv_events_fresh must be positive")
	}
	return nil
}

// variant separates cache_aware states with different kv_events settings.
func (o kvEventsOptions) variant() string {
	if !o.enabled() {
		return ""
	}
	return fmt.Sprintf("kv=%s,%s,%s", o.KVEvents, o.KVEventsTokenizer, time.Duration(o.KVEventsFresh))
}

func init() {
	registerCollectors(kvEventsCollector)
}

// kvEventsCollector reports the listener of every pool that has one.
var kvEventsCollector = kvevents.NewCollector(func() map[string]kvevents.Source {
	out := map[string]kvevents.Source{}
	kvListeners.Range(func(_, v any) bool {
		k := v.(*kvListener)
		out[k.pool] = kvevents.Source{Index: k.ix, Listener: k.l}
		return true
	})
	return out
})

// kvListeners holds one listener and index per listen address, reference
// counted, so a reload that keeps the address keeps the socket and the
// index even when the policy's state is rebuilt.
var kvListeners = caddy.NewUsagePool()

type kvListener struct {
	pool string
	ix   *kvevents.Index
	l    *kvevents.Listener

	mu      sync.Mutex
	pickers []*cacheaware.Picker // the states using it: a pod is a replica of any of them
}

// Destruct implements caddy.Destructor.
func (k *kvListener) Destruct() error { return k.l.Close() }

// resolve maps a topic's pod to the replica with that dial address.
func (k *kvListener) resolve(pod string) (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.pickers {
		if slices.Contains(p.Router().Addrs(), pod) {
			return pod, true
		}
	}
	return "", false
}

// attachKVEvents gives pk the exact view of the listener on o.KVEvents
// (bound on first use) and returns what releases it.
func attachKVEvents(pool string, o kvEventsOptions, pk *cacheaware.Picker) (release func(), stats func() *KVEventsStats, err error) {
	hp, err := kvevents.ParseListenAddr(o.KVEvents)
	if err != nil {
		return nil, nil, err
	}
	var kl *kvListener
	v, _, err := kvListeners.LoadOrNew(hp, func() (caddy.Destructor, error) {
		k := &kvListener{pool: pool, ix: kvevents.NewIndex(kvevents.Config{})}
		l, err := kvevents.Listen(kvevents.ListenerConfig{Addr: o.KVEvents, Index: k.ix, Resolve: k.resolve})
		if err != nil {
			return nil, err
		}
		k.l = l
		return k, nil
	})
	if err != nil {
		return nil, nil, err
	}
	kl = v.(*kvListener)
	if kl.pool != pool {
		_, _ = kvListeners.Delete(hp)
		return nil, nil, fmt.Errorf("kv_events %s is already the listener of pool %q", o.KVEvents, kl.pool)
	}
	kl.mu.Lock()
	kl.pickers = append(kl.pickers, pk)
	kl.mu.Unlock()
	pk.SetExact(&kvevents.Prefixes{Index: kl.ix, Tokenizer: kvTokenizers[o.KVEventsTokenizer],
		FreshFor: time.Duration(o.KVEventsFresh)})
	var once sync.Once
	release = func() {
		once.Do(func() {
			pk.SetExact(nil)
			kl.mu.Lock()
			kl.pickers = slices.DeleteFunc(kl.pickers, func(p *cacheaware.Picker) bool { return p == pk })
			kl.mu.Unlock()
			_, _ = kvListeners.Delete(hp)
		})
	}
	fresh := time.Duration(o.KVEventsFresh)
	if fresh <= 0 {
		fresh = 30 * time.Second
	}
	stats = func() *KVEventsStats { return kvEventsStats(kl, fresh) }
	return release, stats, nil
}

// KVEventsStats is what health shows of the exact index: per replica,
// whether it is scored exactly now (fresh events), its blocks and last
// event; the counters of batches, gaps and drops.
type KVEventsStats struct {
	Listen   string                     `json:"listen"`
	Replicas map[string]KVEventsReplica `json:"replicas"`
	Totals   map[string]uint64          `json:"totals"`
	Drops    map[kvevents.Reason]uint64 `json:"drops,omitempty"`
	Guard    kvevents.GuardStats        `json:"guard"`
}

// KVEventsReplica is one replica's part of KVEventsStats.
type KVEventsReplica struct {
	Mode      string    `json:"mode"` // exact (fresh events) or approximate (the tree)
	Blocks    int       `json:"blocks"`
	LastEvent time.Time `json:"last_event,omitempty"`
}

func kvEventsStats(kl *kvListener, fresh time.Duration) *KVEventsStats {
	s := kl.ix.Stats()
	out := &KVEventsStats{Listen: kl.l.Addr().String(), Replicas: map[string]KVEventsReplica{},
		Drops: s.Drops, Guard: kl.l.GuardStats(), Totals: map[string]uint64{
			"batches": s.Batches, "events": s.Events, "unknown_events": s.UnknownEvents, "gaps": s.Gaps,
			"restarts": s.Restarts, "cleared": s.Cleared, "removed_unknown": s.RemovedUnknown,
			"capacity_evicted": s.CapacityEvicted, "blocks": uint64(s.Blocks),
		}}
	now := time.Now()
	for name, r := range s.Replicas {
		mode := "approximate"
		if !r.LastEvent.IsZero() && now.Sub(r.LastEvent) <= fresh {
			mode = "exact"
		}
		out.Replicas[name] = KVEventsReplica{Mode: mode, Blocks: r.Blocks, LastEvent: r.LastEvent}
	}
	return out
}
