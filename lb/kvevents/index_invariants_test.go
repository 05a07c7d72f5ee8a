package kvevents

import (
	"fmt"
	"math/rand"
	"testing"
)

// checkIndex verifies the index's bookkeeping against its entries: per
// replica, the key counts, blocks and weight; the totals; the tombs.
func checkIndex(t *testing.T, ix *Index, step int) {
	t.Helper()
	total, totalW, tombs := 0, 0, 0
	for name, r := range ix.replicas {
		keys := map[uint64]int32{}
		n, w := 0, 0
		for e := r.head; e != nil; e = e.next {
			n++
			w += weight(e.keys)
			for _, k := range e.keys {
				keys[k]++
			}
			if r.sources[e.src][e.hash] != e {
				t.Fatalf("step %d: %s: entry %x not in its source", step, name, e.hash)
			}
		}
		inSources := 0
		for _, bs := range r.sources {
			inSources += len(bs)
		}
		if n != r.n || w != r.w || inSources != n || len(keys) != len(r.keys) {
			t.Fatalf("step %d: %s: %d entries (n %d), weight %d (w %d), %d in sources, %d keys (held %d)",
				step, name, n, r.n, w, r.w, inSources, len(keys), len(r.keys))
		}
		for k, c := range keys {
			if r.keys[k] != c {
				t.Fatalf("step %d: %s: key %x counted %d, held %d", step, name, k, c, r.keys[k])
			}
		}
		if r.w > ix.cfg.MaxBlocksPerReplica {
			t.Fatalf("step %d: %s weighs %d, bound %d", step, name, r.w, ix.cfg.MaxBlocksPerReplica)
		}
		total += n
		totalW += w
	}
	topics := map[string]int{}
	for _, st := range ix.seqs {
		topics[st.name]++
	}
	for name, r := range ix.replicas {
		if topics[name] != r.topics || r.topics > maxSourcesPerReplica {
			t.Fatalf("step %d: %s: %d topics tracked, counted %d", step, name, topics[name], r.topics)
		}
	}
	for tb := ix.tombHead; tb != nil; tb = tb.next {
		tombs += weight(tb.keys)
		if tb.r.tombs[tb.key] != tb {
			t.Fatalf("step %d: a tomb not in its replica", step)
		}
	}
	if total != ix.total || totalW != ix.totalW || tombs != ix.tombs || totalW > ix.cfg.MaxBlocksTotal || tombs > ix.maxTombs() {
		t.Fatalf("step %d: total %d (%d), weight %d (%d), tombs %d (%d)", step, total, ix.total, totalW, ix.totalW, tombs, ix.tombs)
	}
}

// Random stores, removals, clears, gaps, restarts and forgets, with
// engine blocks of several sizes, keep the index's books straight.
func TestIndexBookkeepingUnderRandomEvents(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	ix := NewIndex(Config{MaxBlocksPerReplica: 64, MaxBlocksTotal: 150})
	seqs := map[string]uint64{}
	for step := 0; step < 3000; step++ {
		name := fmt.Sprint("r", rng.Intn(3))
		topic := "kv@10.0.0.1:8000@" + name
		seq := seqs[name] + 1
		switch rng.Intn(20) {
		case 0:
			seq += 2 // a gap
		case 1:
			seq = 0 // a restart
		}
		seqs[name] = seq
		var ev Event
		switch k := rng.Intn(10); {
		case k < 5:
			bs := []int{1, 8, 16, 24, 64}[rng.Intn(5)]
			n := 1 + rng.Intn(6)
			base := uint64(rng.Intn(40))
			hs := make([]BlockHash, n)
			for i := range hs {
				hs[i] = IntHash(base + uint64(i))
			}
			tokens := seqTokens(int(base)*bs, n*bs)
			ev = Event{Kind: BlockStored, BlockHashes: hs, TokenIDs: tokens, BlockSize: bs, Medium: []string{"GPU", "CPU"}[rng.Intn(2)]}
			if base > 0 && rng.Intn(2) == 0 {
				ev.Parent = IntHash(base - 1)
			}
		case k < 9:
			hs := make([]BlockHash, 1+rng.Intn(4))
			for i := range hs {
				hs[i] = IntHash(uint64(rng.Intn(46)))
			}
			ev = Event{Kind: BlockRemoved, BlockHashes: hs, Medium: "GPU"}
		default:
			ev = Event{Kind: AllBlocksCleared}
		}
		ix.Apply(name, Message{Topic: topic, Seq: seq, Batch: Batch{Events: []Event{ev}, DPRank: rng.Intn(80)}}, t0)
		if rng.Intn(100) == 0 {
			ix.Forget(fmt.Sprint("r", rng.Intn(3)))
		}
		checkIndex(t, ix, step)
	}
}
