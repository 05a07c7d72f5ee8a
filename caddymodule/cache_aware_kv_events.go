package caddymodule

import (
	"crypto/tls"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/kvevents"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/streamrelay"
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
	// must be the engine's: engine (the default: ask the replicas'
	// /tokenize, vLLM's and SGLang's endpoint, in the background, and cache
	// the answers) or llmd_sim (llm-d-inference-sim's dummy rule, computed
	// by Sluice).
	KVEventsTokenizer string `json:"kv_events_tokenizer,omitempty"`
	// The engine tokenizer's bounds: one /tokenize request's time
	// (default 2s), the cache of tokenized prefixes in bytes (default 64
	// MiB), the requests in flight at once (default 4).
	KVEventsTokenizeTimeout     caddy.Duration `json:"kv_events_tokenize_timeout,omitempty" sluice:"positive"`
	KVEventsTokenizeCache       int64          `json:"kv_events_tokenize_cache,omitempty" sluice:"min=1"`
	KVEventsTokenizeConcurrency int            `json:"kv_events_tokenize_concurrency,omitempty" sluice:"min=1"`
	// KVEventsFresh: a replica with no event batch for longer is scored by
	// the tree (default 30s).
	KVEventsFresh caddy.Duration `json:"kv_events_fresh,omitempty" sluice:"positive"`
	// KVEventsReplayPort: each replica's engine serves its replay socket
	// (vLLM's --kv-events-config replay_endpoint, e.g. tcp://*:5558) on this
	// port of the replica's dial host (plus the data-parallel rank, as vLLM
	// offsets it). A sequence gap is then filled from the engine's buffer
	// when it still holds the lost messages, and clears the replica's
	// entries only when not. 0 (the default): no replay, a gap clears.
	KVEventsReplayPort int `json:"kv_events_replay_port,omitempty" sluice:"min=1"`
}

// The values of kv_events_tokenizer.
const (
	kvTokenizerEngine  = "engine"
	kvTokenizerLLMDSim = "llmd_sim"
)

// Bounds on the engine tokenizer's settings.
const (
	maxKVTokenizeTimeout     = time.Minute
	maxKVTokenizeCache       = 4 << 30
	maxKVTokenizeConcurrency = 256
)

func (o kvEventsOptions) enabled() bool { return o.KVEvents != "" }

func (o kvEventsOptions) tokenizer() string {
	if o.KVEventsTokenizer == "" {
		return kvTokenizerEngine
	}
	return o.KVEventsTokenizer
}

// engineConfig is the engine tokenizer's configuration.
func (o kvEventsOptions) engineConfig() kvevents.EngineConfig {
	c := kvevents.EngineConfig{Timeout: time.Duration(o.KVEventsTokenizeTimeout),
		MaxBytes: o.KVEventsTokenizeCache, Concurrency: o.KVEventsTokenizeConcurrency}.WithDefaults()
	// Entries: the bytes at 16 KiB an entry (a 4,096-token prefix), at
	// least 1,024.
	c.MaxEntries = int(max(c.MaxBytes/(16<<10), 1024))
	return c
}

func (o kvEventsOptions) validate() error {
	engineSet := o.KVEventsTokenizeTimeout != 0 || o.KVEventsTokenizeCache != 0 || o.KVEventsTokenizeConcurrency != 0
	if !o.enabled() {
		if o.KVEventsTokenizer != "" || o.KVEventsFresh != 0 || engineSet {
			return fmt.Errorf("kv_events_tokenizer, kv_events_fresh and kv_events_tokenize_* need kv_events")
		}
		if o.KVEventsReplayPort != 0 {
			return fmt.Errorf("kv_events_replay_port needs kv_events")
		}
		return nil
	}
	if o.KVEventsReplayPort < 0 || o.KVEventsReplayPort > 65535 {
		return fmt.Errorf("kv_events_replay_port %d: want a port, 1 to 65535", o.KVEventsReplayPort)
	}
	if _, err := kvevents.ParseListenAddr(o.KVEvents); err != nil {
		return err
	}
	switch o.tokenizer() {
	case kvTokenizerEngine:
	case kvTokenizerLLMDSim:
		if engineSet {
			return fmt.Errorf("kv_events_tokenize_timeout, kv_events_tokenize_cache and kv_events_tokenize_concurrency are the engine tokenizer's: kv_events_tokenizer is llmd_sim")
		}
	default:
		return fmt.Errorf("kv_events_tokenizer %q: want engine (ask the replicas' /tokenize, the default) or llmd_sim", o.KVEventsTokenizer)
	}
	switch {
	case o.KVEventsFresh < 0:
		return fmt.Errorf("kv_events_fresh must be positive")
	case o.KVEventsTokenizeTimeout < 0 || time.Duration(o.KVEventsTokenizeTimeout) > maxKVTokenizeTimeout:
		return fmt.Errorf("kv_events_tokenize_timeout %s: want a positive duration up to %s", time.Duration(o.KVEventsTokenizeTimeout), maxKVTokenizeTimeout)
	case o.KVEventsTokenizeCache < 0 || o.KVEventsTokenizeCache > maxKVTokenizeCache:
		return fmt.Errorf("kv_events_tokenize_cache %d: want 1 to %d bytes", o.KVEventsTokenizeCache, int64(maxKVTokenizeCache))
	case o.KVEventsTokenizeConcurrency < 0 || o.KVEventsTokenizeConcurrency > maxKVTokenizeConcurrency:
		return fmt.Errorf("kv_events_tokenize_concurrency %d: want 1 to %d", o.KVEventsTokenizeConcurrency, maxKVTokenizeConcurrency)
	}
	return nil
}

// variant separates cache_aware states with different kv_events settings.
func (o kvEventsOptions) variant() string {
	if !o.enabled() {
		return ""
	}
	v := fmt.Sprintf("kv=%s,%s,%s", o.KVEvents, o.tokenizer(), time.Duration(o.KVEventsFresh))
	if o.tokenizer() == kvTokenizerEngine {
		c := o.engineConfig()
		v += fmt.Sprintf(",%s,%d,%d", c.Timeout, c.MaxBytes, c.Concurrency)
	}
	if o.KVEventsReplayPort != 0 {
		v += fmt.Sprintf(",replay=%d", o.KVEventsReplayPort)
	}
	return v
}

func init() {
	registerCollectors(kvEventsCollector)
}

// kvEventsCollector reports the listeners of every pool that has one (a
// pool served on several sites may have one on each: all of them, not
// the last one the range met).
var kvEventsCollector = kvevents.NewCollector(func() map[string][]kvevents.Source {
	out := map[string][]kvevents.Source{}
	kvListeners.Range(func(_, v any) bool {
		k := v.(*kvListener)
		out[k.pool] = append(out[k.pool], kvevents.Source{Index: k.ix, Listener: k.l, Tokenize: k.tokenizeStats, Relay: k.relayStats})
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
	// engine tokenizers of those states (one per state with kv_events_tokenizer engine)
	tokenizers map[*cacheaware.Picker]*kvevents.EngineTokenizer
	// kv_events_replay_port of those states that set it
	replayPorts map[*cacheaware.Picker]int
	// sets: the replica set each of those states was last given (it
	// comes after the state attaches: with reverse_proxy's own upstreams,
	// at its first request); members: their union when the index last
	// followed them (see follow).
	sets    map[*cacheaware.Picker][]string
	members map[string]bool
	// relays to the other instances, one per Redis connection the states
	// share their trees through (connectionKey), kept while a state uses
	// it: a reload that keeps the connection keeps the relay, so no
	// message is relayed twice.
	relays map[string]*kvRelay
}

// kvRelay is a relay and the states using it.
type kvRelay struct {
	r     *kvevents.Relay
	users int
}

// relay returns the relay through conn, started on first use, and what
// releases it.
func (k *kvListener) relay(conn redisconn.Config) (*kvevents.Relay, func()) {
	key := connectionKey(conn)
	k.mu.Lock()
	defer k.mu.Unlock()
	kr := k.relays[key]
	if kr == nil {
		if k.relays == nil {
			k.relays = map[string]*kvRelay{}
		}
		kr = &kvRelay{r: kvevents.NewRelay(streamrelay.Config{Conn: conn, Key: kvevents.RelayKey(conn.KeyPrefix, k.pool)}, k.l)}
		k.relays[key] = kr
	}
	kr.users++
	var once sync.Once
	return kr.r, func() {
		once.Do(func() {
			k.mu.Lock()
			kr.users--
			last := kr.users == 0
			if last {
				delete(k.relays, key)
			}
			k.mu.Unlock()
			if last {
				kr.r.Close()
			}
		})
	}
}

// relayStats sums the relays' counters (nil: none).
func (k *kvListener) relayStats() *streamrelay.Stats {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.relays) == 0 {
		return nil
	}
	all := make([]streamrelay.Stats, 0, len(k.relays))
	for _, kr := range k.relays {
		all = append(all, kr.r.Stats())
	}
	sum := sumRelayStats(all)
	return &sum
}

// sumRelayStats is the pool's relay as one: counters added up, connected
// only if all are, the largest lag.
func sumRelayStats(all []streamrelay.Stats) streamrelay.Stats {
	sum := streamrelay.Stats{Connected: true}
	for _, st := range all {
		sum.Published += st.Published
		sum.Applied += st.Applied
		sum.Dropped += st.Dropped
		sum.Errors += st.Errors
		sum.Pending += st.Pending
		sum.PendingBytes += st.PendingBytes
		sum.Oversize += st.Oversize
		sum.Resets += st.Resets
		sum.LagMillis = max(sum.LagMillis, st.LagMillis)
		sum.Connected = sum.Connected && st.Connected
		sum.Instance = st.Instance
	}
	return sum
}

// tokenizeStats sums the engine tokenizers' counters (nil: none).
func (k *kvListener) tokenizeStats() *kvevents.EngineStats {
	k.mu.Lock()
	toks := make([]*kvevents.EngineTokenizer, 0, len(k.tokenizers))
	for _, t := range k.tokenizers {
		toks = append(toks, t)
	}
	k.mu.Unlock()
	if len(toks) == 0 {
		return nil
	}
	var sum kvevents.EngineStats
	for _, t := range toks {
		sum.Add(t.Stats())
	}
	return &sum
}

// Destruct implements caddy.Destructor.
func (k *kvListener) Destruct() error {
	k.mu.Lock()
	relays := k.relays
	k.relays = nil
	k.mu.Unlock()
	for _, kr := range relays {
		kr.r.Close()
	}
	return k.l.Close()
}

// kvSetFollower is the KV cache size source cache_aware gives its picker
// with kv_events: the picker hands it every new replica set just after
// its tree dropped the removed replicas (the picker's one hook on its set),
// and the index then follows (kvListener.followLocked).
type kvSetFollower struct {
	kvCapacity
	kl   *kvListener
	pk   *cacheaware.Picker
	urls *replicaURLs // nil without the engine tokenizer
}

// SetBackends implements the picker's set follower.
func (f kvSetFollower) SetBackends(set []lb.Backend) {
	f.kvCapacity.SetBackends(set)
	if f.urls != nil {
		f.urls.set(set)
	}
	f.kl.setReplicas(f.pk, lb.Dials(set))
}

// replicaURLs are a state's replicas' URLs by dial address, from the set
// its picker was last given (the managed set, or reverse_proxy's static
// upstreams with its transport's scheme): the engine tokenizer asks
// /tokenize there, so a replica reached over TLS is asked over TLS.
type replicaURLs struct {
	m atomic.Pointer[map[string]string]
}

func (u *replicaURLs) set(set []lb.Backend) {
	m := make(map[string]string, len(set))
	for _, b := range set {
		m[b.Dial] = b.URL
	}
	u.m.Store(&m)
}

// of is the URL of the replica at addr; http://addr for one not in the
// set (yet).
func (u *replicaURLs) of(addr string) string {
	if m := u.m.Load(); m != nil {
		if url, ok := (*m)[addr]; ok {
			return url
		}
	}
	return "http://" + addr
}

// setReplicas records pk's new replica set and follows it.
func (k *kvListener) setReplicas(pk *cacheaware.Picker, set []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !slices.Contains(k.pickers, pk) {
		return // detached: its state is being destroyed
	}
	if k.sets == nil {
		k.sets = map[*cacheaware.Picker][]string{}
	}
	k.sets[pk] = set
	k.followLocked()
}

// followLocked makes the index forget the replicas that left the pool
// (the union of the attached states' sets), as the tree does: their
// blocks would take the live replicas' room in the index's bounds, show
// in health, and be believed if the address came back. A replica that
// joined is forgotten too: what the index holds of it is from before it
// left (a message applied as it was being removed), and the tree starts
// it empty as well. A replica marked down stays in the set, and so in the
// index: its engine keeps its cache and its events. With no state's set
// known yet (a reload's new state before its first request), nothing is
// known to have left.
func (k *kvListener) followLocked() {
	if len(k.sets) == 0 {
		return
	}
	now := map[string]bool{}
	for _, set := range k.sets {
		for _, a := range set {
			now[a] = true
		}
	}
	k.ix.Retain(func(name string) bool { return now[name] && k.members[name] })
	k.members = now
}

// replayPort is the kv_events_replay_port of the newest state whose pool
// has pod (a reload's new state is attached after the old one), 0: none.
func (k *kvListener) replayPort(pod string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := len(k.pickers) - 1; i >= 0; i-- {
		if p := k.pickers[i]; slices.Contains(p.Router().Addrs(), pod) {
			return k.replayPorts[p]
		}
	}
	return 0
}

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
// (bound on first use) and capacity as its KV cache size source, and
// returns what releases them. The index follows pk's replica set through
// capacity (kvSetFollower). With conn (the tree shared through Redis), the
// events the listener receives are relayed to the pool's other instances
// and theirs applied here.
func attachKVEvents(pool string, o kvEventsOptions, pk *cacheaware.Picker, capacity kvCapacity, conn *redisconn.Config) (release func(), stats func() *KVEventsStats, setTLS func(*tls.Config), err error) {
	hp, err := kvevents.ParseListenAddr(o.KVEvents)
	if err != nil {
		return nil, nil, nil, err
	}
	var kl *kvListener
	v, _, err := kvListeners.LoadOrNew(hp, func() (caddy.Destructor, error) {
		k := &kvListener{pool: pool, ix: kvevents.NewIndex(kvevents.Config{})}
		l, err := kvevents.Listen(kvevents.ListenerConfig{Addr: o.KVEvents, Index: k.ix, Resolve: k.resolve,
			ReplayPort: k.replayPort})
		if err != nil {
			return nil, err
		}
		k.l = l
		return k, nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	kl = v.(*kvListener)
	if kl.pool != pool {
		_, _ = kvListeners.Delete(hp)
		return nil, nil, nil, fmt.Errorf("kv_events %s is already the listener of pool %q", o.KVEvents, kl.pool)
	}
	var tok kvevents.Tokenizer = kvevents.SimTokenizer{}
	var engine *kvevents.EngineTokenizer
	var urls *replicaURLs
	engineTransport := tokenizerTransport(o) // nil without the engine tokenizer
	if o.tokenizer() == kvTokenizerEngine {
		urls = &replicaURLs{}
		c := o.engineConfig()
		c.BaseURL = urls.of
		c.Transport = engineTransport
		engine = kvevents.NewEngineTokenizer(c)
		tok = engine
	}
	kl.mu.Lock()
	kl.pickers = append(kl.pickers, pk)
	if engine != nil {
		if kl.tokenizers == nil {
			kl.tokenizers = map[*cacheaware.Picker]*kvevents.EngineTokenizer{}
		}
		kl.tokenizers[pk] = engine
	}
	if o.KVEventsReplayPort > 0 {
		if kl.replayPorts == nil {
			kl.replayPorts = map[*cacheaware.Picker]int{}
		}
		kl.replayPorts[pk] = o.KVEventsReplayPort
	}
	kl.mu.Unlock()
	var relay *kvevents.Relay
	unrelay := func() {}
	if conn != nil {
		relay, unrelay = kl.relay(*conn)
	}
	pk.SetExact(&kvevents.Prefixes{Index: kl.ix, Tokenizer: tok, FreshFor: time.Duration(o.KVEventsFresh),
		// a peer's decision names its replica from Redis: only the pool's
		IsReplica: func(addr string) bool { return slices.Contains(pk.Router().Addrs(), addr) }})
	// the follower gets pk's set now (if it has one) and each later one
	pk.SetCapacity(kvSetFollower{kvCapacity: capacity, kl: kl, pk: pk, urls: urls})
	var once sync.Once
	release = func() {
		once.Do(func() {
			pk.SetExact(nil)
			unrelay()
			kl.mu.Lock()
			kl.pickers = slices.DeleteFunc(kl.pickers, func(p *cacheaware.Picker) bool { return p == pk })
			delete(kl.tokenizers, pk)
			delete(kl.replayPorts, pk)
			delete(kl.sets, pk)
			kl.followLocked() // the replicas only this state had leave the pool
			kl.mu.Unlock()
			if engine != nil {
				engine.Close()
				engineTransport.CloseIdleConnections()
			}
			_, _ = kvListeners.Delete(hp)
		})
	}
	fresh := time.Duration(o.KVEventsFresh)
	if fresh <= 0 {
		fresh = 30 * time.Second
	}
	stats = func() *KVEventsStats {
		s := kvEventsStats(kl, fresh)
		s.Tokenizer = o.tokenizer()
		if relay != nil {
			rs := relay.Stats()
			s.Relay = &rs
		}
		if engine != nil {
			es := engine.Stats()
			s.Tokenize = &es
		}
		return s
	}
	// The proxy's TLS config, handed by the selector when a config starts:
	// the KV cache size scrapes and /tokenize read the replicas with it.
	return release, stats, kvEventsTLS(capacity, engineTransport), nil
}

// KVEventsStats is what health shows of the exact index: per replica,
// whether it is scored exactly now (fresh events), its blocks and last
// event; the counters of batches, gaps, replays and drops.
type KVEventsStats struct {
	Listen   string                     `json:"listen"`
	Replicas map[string]KVEventsReplica `json:"replicas"`
	Totals   map[string]uint64          `json:"totals"`
	// Drops are event messages dropped whole, by reason; EventDrops single
	// events dropped from a message otherwise applied.
	Drops      map[kvevents.Reason]uint64 `json:"drops,omitempty"`
	EventDrops map[kvevents.Reason]uint64 `json:"event_drops,omitempty"`
	Guard      kvevents.GuardStats        `json:"guard"`
	// Tokenizer is kv_events_tokenizer; Tokenize the engine tokenizer's
	// counters (cache hits, requests, failures by reason).
	Tokenizer string                `json:"tokenizer"`
	Tokenize  *kvevents.EngineStats `json:"tokenize,omitempty"`
	// Relay: the events relayed to and from the pool's other instances
	// through Redis (with redis set).
	Relay *streamrelay.Stats `json:"relay,omitempty"`
}

// KVEventsReplica is one replica's part of KVEventsStats.
type KVEventsReplica struct {
	Mode   string `json:"mode"` // exact (fresh events) or approximate (the tree)
	Blocks int    `json:"blocks"`
	// Capacity is the engine's KV cache size in tokens, from its
	// metrics (0: not known).
	Capacity  int       `json:"capacity_tokens,omitempty"`
	LastEvent time.Time `json:"last_event,omitempty"`
}

func kvEventsStats(kl *kvListener, fresh time.Duration) *KVEventsStats {
	s := kl.ix.Stats()
	out := &KVEventsStats{Listen: kl.l.Addr().String(), Replicas: map[string]KVEventsReplica{},
		Drops: s.Drops, EventDrops: s.EventDrops, Guard: kl.l.GuardStats(), Totals: map[string]uint64{
			"batches": s.Batches, "events": s.Events, "unknown_events": s.UnknownEvents, "gaps": s.Gaps,
			"restarts": s.Restarts, "cleared": s.Cleared, "removed_unknown": s.RemovedUnknown,
			"capacity_evicted": s.CapacityEvicted, "re_stored": s.ReStored, "blocks": uint64(s.Blocks),
			"replays_recovered": s.Replays.Recovered, "replays_too_old": s.Replays.TooOld,
			"replays_failed": s.Replays.Failed,
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

// KVEventsListeners reports the kv_events listeners of pool (one per
// listen address: several when one process serves the pool on several
// sites), by address, with fresh meaning fresh (0: the default 30 s).
func KVEventsListeners(pool string, fresh time.Duration) map[string]*KVEventsStats {
	if fresh <= 0 {
		fresh = 30 * time.Second
	}
	out := map[string]*KVEventsStats{}
	kvListeners.Range(func(_, v any) bool {
		if k := v.(*kvListener); k.pool == pool {
			s := kvEventsStats(k, fresh)
			s.Relay = k.relayStats()
			out[s.Listen] = s
		}
		return true
	})
	return out
}
