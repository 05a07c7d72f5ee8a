package caddymodule

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/kvevents"
	"github.com/sluice-router/sluice/lb/tracker"
)

// A peer's routing decision comes from the pool's Redis stream (outside
// input): its replica must be one of the pool's before the exact index
// takes it as a speculative entry. Otherwise every made-up address becomes
// an index replica (up to 4,096, each with up to 16,384 speculative keys),
// shown in health and as a label of sluice_kv_events_blocks.
func TestKVPeerSpeculationOnlyForPoolReplicas(t *testing.T) {
	pk := cacheaware.NewPicker(cacheaware.Config{}, tracker.Config{})
	pk.SetReplicas([]string{"10.0.0.1:8000", "10.0.0.2:8000"})
	release, stats, _, err := attachKVEvents("kvpeer", kvEventsOptions{KVEvents: "tcp://" + freeKVAddr(t),
		KVEventsTokenizer: kvTokenizerLLMDSim}, pk, newKVCapacity(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	text := strings.Repeat("one shared prompt of many words ", 16)
	for i := 0; i < 100; i++ {
		pk.PeerRouted("m", text, fmt.Sprintf("evil-%d:%s", i, strings.Repeat("x", 64)), "", false)
	}
	pk.PeerRouted("m", text, "10.0.0.2:8000", "", false)
	s := stats()
	for name := range s.Replicas {
		if name != "10.0.0.2:8000" {
			t.Fatalf("the index made %d replicas of a peer's addresses, e.g. %q", len(s.Replicas), name)
		}
	}
	if _, ok := s.Replicas["10.0.0.2:8000"]; !ok {
		t.Fatalf("a pool replica's peer decision was not taken: %v", s.Replicas)
	}
}

// freeKVAddr is a loopback host:port free a moment ago.
func freeKVAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// A replica removed from the pool's set (set-backends, a reload) leaves
// the exact index with it, as it leaves the tree: its blocks would crowd
// out the live replicas' in the index's budget, show in health, and be
// believed if it came back at the same address.
func TestKVRemovedReplicaLeavesTheIndex(t *testing.T) {
	name, a, b, pk, kl := provisionKVPool(t)
	storeKVBlock(t, kl, a, 1, kvPromptA)
	storeKVBlock(t, kl, b, 1, kvPromptB)
	if n := kvBlocks(t, name, a); n != 1 {
		t.Fatalf("%s has %d blocks indexed before its removal, want 1", a, n)
	}

	setKVPool(t, name, b)
	if _, ok := kvReplicas(t, name)[a]; ok {
		t.Fatalf("removed replica %s still in the index: %v", a, kvReplicas(t, name))
	}
	if n := kvBlocks(t, name, b); n != 1 {
		t.Fatalf("the replica that stayed has %d blocks, want its 1", n)
	}

	// Back at the same address: it starts empty, as in the tree.
	setKVPool(t, name, a, b)
	if n := kvBlocks(t, name, a); n != 0 {
		t.Fatalf("re-added %s has %d blocks from before its removal", a, n)
	}
	if d := pickKV(t, pk, kvPromptA); d.Addr == a && d.Reason == cacheaware.CacheHit {
		t.Fatalf("re-added %s picked as a cache hit on its forgotten block: %+v", a, d)
	}
}

// A replica that failures marked down stays in the pool's set, and its
// engine still holds its cache (and still publishes): its blocks stay
// indexed, as its text stays in the tree, so it gets its prefixes back
// when it recovers.
func TestKVDownReplicaKeepsItsBlocks(t *testing.T) {
	name, a, _, pk, kl := provisionKVPool(t)
	storeKVBlock(t, kl, a, 1, kvPromptA)
	for i := 0; !pk.Tracker().Down(a); i++ {
		if i == 100 {
			t.Fatal("failures never marked the replica down")
		}
		if l := pk.Tracker().Acquire(a); l != nil {
			l.Release(lb.Outcome{Kind: lb.Failure})
		}
	}
	if n := kvBlocks(t, name, a); n != 1 {
		t.Fatalf("a replica marked down has %d blocks indexed, want its 1", n)
	}
}

// provisionKVPool provisions cache_aware with kv_events (llmd_sim
// tokenizer) on a managed pool of two replicas; it returns the pool, the
// replicas, the picker and the listener.
func provisionKVPool(t *testing.T) (name, a, b string, pk *cacheaware.Picker, kl *kvListener) {
	t.Helper()
	cctx := provisionContext(t)
	name = freshPoolName("kv-forget")
	a, b = "127.0.0.1:9", "127.0.0.1:10"
	setKVPool(t, name, a, b)
	p := &CacheAware{Pool: name, kvEventsOptions: kvEventsOptions{KVEvents: "tcp://" + freeKVAddr(t),
		KVEventsTokenizer: kvTokenizerLLMDSim}}
	if err := p.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Cleanup() })
	pk = pickersOf[*cacheaware.Picker]("cache_aware")[name]
	if pk == nil {
		t.Fatalf("no cache_aware picker for pool %s", name)
	}
	return name, a, b, pk, kvListenerOf(t, name)
}

// kvListenerOf is pool's kv_events listener.
func kvListenerOf(t *testing.T, pool string) *kvListener {
	t.Helper()
	var kl *kvListener
	kvListeners.Range(func(_, v any) bool {
		if k := v.(*kvListener); k.pool == pool {
			kl = k
		}
		return true
	})
	if kl == nil {
		t.Fatalf("no kv_events listener for pool %s", pool)
	}
	return kl
}

func setKVPool(t *testing.T, name string, dials ...string) {
	t.Helper()
	urls := make([]string, len(dials))
	for i, d := range dials {
		urls[i] = "http://" + d
	}
	bs, err := lb.ParseBackends(urls)
	if err != nil {
		t.Fatal(err)
	}
	lb.GetPool(name).Set(bs)
}

// Prompts of one block (16 tokens under llmd_sim).
var (
	kvPromptA = strings.Repeat("a ", 16)
	kvPromptB = strings.Repeat("b ", 16)
)

// storeKVBlock has replica's engine publish (message seq) the block of
// prompt, as the listener gets it.
func storeKVBlock(t *testing.T, kl *kvListener, replica string, seq uint64, prompt string) {
	t.Helper()
	ids, _ := kvevents.SimTokenizer{}.Tokenize("m", prompt)
	if len(ids) != 16 {
		t.Fatalf("%d tokens, want one block of 16", len(ids))
	}
	tokens := make([]any, len(ids))
	for i, id := range ids {
		tokens[i] = id
	}
	payload, err := msgpack.Marshal([]any{1.5, []any{
		[]any{"BlockStored", []any{uint64(seq)}, nil, tokens, 16, nil, "GPU"}}, 0})
	if err != nil {
		t.Fatal(err)
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	kl.l.Inject([][]byte{[]byte("kv@" + replica + "@m"), s[:], payload})
}

// kvReplicas is the index's replicas as the pool's health shows them.
func kvReplicas(t *testing.T, pool string) map[string]KVEventsReplica {
	t.Helper()
	ls := KVEventsListeners(pool, 0)
	if len(ls) != 1 {
		t.Fatalf("%d kv_events listeners for pool %s, want 1", len(ls), pool)
	}
	for _, s := range ls {
		return s.Replicas
	}
	return nil
}

func kvBlocks(t *testing.T, pool, replica string) int {
	t.Helper()
	return kvReplicas(t, pool)[replica].Blocks
}

// pickKV picks for a parsed prompt and releases the lease.
func pickKV(t *testing.T, pk *cacheaware.Picker, text string) cacheaware.Decision {
	t.Helper()
	return pickKVRequest(t, pk, &lb.Request{Model: "m", Text: text, Parsed: true})
}

// pickKVRequest picks for req, releases the lease and returns the
// decision.
func pickKVRequest(t *testing.T, pk *cacheaware.Picker, req *lb.Request) cacheaware.Decision {
	t.Helper()
	l, d, err := pk.PickDecision(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	l.Release(lb.Outcome{Kind: lb.Success})
	return d
}

// When a reload replaces the policy's state, the listener and its index
// stay; the old state going away takes out the replicas only it had, and
// only once the new state has its set (with reverse_proxy's own
// upstreams, at its first request): until then nothing is known to have
// left.
func TestKVReplacedStateTakesOutOnlyItsReplicas(t *testing.T) {
	a, b := "127.0.0.1:9", "127.0.0.1:10"
	opts := kvEventsOptions{KVEvents: "tcp://" + freeKVAddr(t), KVEventsTokenizer: kvTokenizerLLMDSim}
	old := cacheaware.NewPicker(cacheaware.Config{}, tracker.Config{})
	old.SetReplicas([]string{a, b})
	releaseOld, stats, _, err := attachKVEvents("kvreload", opts, old, newKVCapacity(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseOld()
	kl := kvListenerOf(t, "kvreload")
	storeKVBlock(t, kl, a, 1, kvPromptA)
	storeKVBlock(t, kl, b, 1, kvPromptB)

	next := cacheaware.NewPicker(cacheaware.Config{}, tracker.Config{})
	releaseNext, _, _, err := attachKVEvents("kvreload", opts, next, newKVCapacity(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseNext()
	releaseOld()
	if s := stats(); s.Replicas[a].Blocks != 1 || s.Replicas[b].Blocks != 1 {
		t.Fatalf("the index forgot replicas before the new state had its set: %v", s.Replicas)
	}
	next.SetReplicas([]string{b})
	s := stats()
	if _, ok := s.Replicas[a]; ok || s.Replicas[b].Blocks != 1 {
		t.Fatalf("after the new state's set {%s}: %v", b, s.Replicas)
	}
}

// kvListenerAt is the kv_events listener bound at addr (host:port).
func kvListenerAt(t *testing.T, addr string) *kvListener {
	t.Helper()
	var kl *kvListener
	kvListeners.Range(func(_, v any) bool {
		if k := v.(*kvListener); k.l.Addr().String() == addr {
			kl = k
		}
		return true
	})
	if kl == nil {
		t.Fatalf("no kv_events listener at %s", addr)
	}
	return kl
}

// A pool served on two sites may have two kv_events listeners (health
// shows both): its metrics are both listeners', not one of them picked
// at random at each scrape (counters jumping between the two), and a
// replica both indexes know (a speculative entry in each) must not make
// the scrape fail on a duplicate series.
func TestKVMetricsOfAPoolWithTwoListeners(t *testing.T) {
	const pool = "kvtwosites"
	a, b := "127.0.0.1:9", "127.0.0.1:10"
	var kls []*kvListener
	for _, set := range [][]string{{a, b}, {a, b}} {
		pk := cacheaware.NewPicker(cacheaware.Config{}, tracker.Config{})
		pk.SetReplicas(set)
		addr := freeKVAddr(t)
		release, _, _, err := attachKVEvents(pool, kvEventsOptions{KVEvents: "tcp://" + addr, KVEventsTokenizer: kvTokenizerLLMDSim},
			pk, newKVCapacity(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		kls = append(kls, kvListenerAt(t, addr))
	}
	storeKVBlock(t, kls[0], a, 1, kvPromptA)
	storeKVBlock(t, kls[1], b, 1, kvPromptB)
	storeKVBlock(t, kls[1], a, 1, kvPromptB)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(kvEventsCollector)
	for i := 0; i < 10; i++ {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("scrape: %v", err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				key, mine := mf.GetName(), false
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "pool":
						mine = l.GetValue() == pool
					case "replica":
						key += "/" + l.GetValue()
					}
				}
				if mine && m.GetCounter() != nil {
					got[key] = m.GetCounter().GetValue()
				} else if mine {
					got[key] = m.GetGauge().GetValue()
				}
			}
		}
		want := map[string]float64{
			"sluice_kv_events_batches_total": 3,
			"sluice_kv_events_blocks/" + a:   2,
			"sluice_kv_events_blocks/" + b:   1,
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("scrape %d: %s = %v, want %v (the pool's: %v)", i, k, got[k], v, got)
			}
		}
	}
}
