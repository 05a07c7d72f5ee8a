package kvevents

import (
	"fmt"
	"testing"
)

// hugeBlocks is a BlockStored message of n engine blocks of bs tokens,
// hashes from base, as a publisher may send it (bs up to the decoder's
// 4096).
func hugeBlocks(topic string, seq uint64, base uint64, n, bs int) Message {
	hs := make([]BlockHash, n)
	for i := range hs {
		hs[i] = IntHash(base + uint64(i))
	}
	tokens := seqTokens(int(base)*bs, n*bs)
	return Message{Topic: topic, Seq: seq, Batch: Batch{Events: []Event{{Kind: BlockStored, BlockHashes: hs, TokenIDs: tokens, BlockSize: bs}}}}
}

// The bounds are what the index holds, not how the engine cuts it: an
// engine block of 4096 tokens completes 256 of Sluice's 16-token blocks
// (256 keys, some 11 KiB). Counted as one, a publisher with big blocks
// (a hostile one, or an engine whose block size is large) made the index
// hold 256 times its bounds: at the defaults some 134 million keys,
// about 6 GiB, where 16-token blocks hold 23 MiB.
func TestIndexBoundsCountWhatABlockHolds(t *testing.T) {
	const perReplica, total = 1024, 2048
	ix := NewIndex(Config{MaxBlocksPerReplica: perReplica, MaxBlocksTotal: total})
	for i := 0; i < 4; i++ {
		topic := fmt.Sprintf("kv@10.0.0.%d:8000@m", i+1)
		ix.Apply(fmt.Sprint("r", i), hugeBlocks(topic, 1, uint64(1000*i), 64, 4096), t0)
	}
	s := ix.Stats()
	keys := 0
	for name, r := range s.Replicas {
		if r.Keys > perReplica {
			t.Errorf("%s holds %d keys (%d engine blocks of 4096 tokens), bound %d blocks of 16", name, r.Keys, r.Blocks, perReplica)
		}
		keys += r.Keys
	}
	if keys > total {
		t.Errorf("the index holds %d keys, bound %d blocks of 16 in all", keys, total)
	}
	// What it keeps is still the newest, and usable.
	if s.CapacityEvicted == 0 || s.Blocks == 0 {
		t.Fatalf("stats: %+v", s)
	}

	// The removed blocks remembered too: their keys are kept for a store
	// again.
	for i := 0; i < 4; i++ {
		topic := fmt.Sprintf("kv@10.0.0.%d:8000@m", i+1)
		name := fmt.Sprint("r", i)
		for j := 0; j < 8; j++ {
			base := uint64(100000*(i+1) + 100*j)
			ix.Apply(name, hugeBlocks(topic, uint64(2+2*j), base, 16, 4096), t0)
			rm := make([]BlockHash, 16)
			for k := range rm {
				rm[k] = IntHash(base + uint64(k))
			}
			ix.Apply(name, Message{Topic: topic, Seq: uint64(3 + 2*j), Batch: Batch{Events: []Event{{Kind: BlockRemoved, BlockHashes: rm}}}}, t0)
		}
	}
	tombKeys := 0
	for t := ix.tombHead; t != nil; t = t.next {
		tombKeys += len(t.keys)
	}
	if max := ix.maxTombs(); tombKeys > max {
		t.Errorf("%d removed blocks remembered with %d keys, bound %d blocks of 16", ix.tombs, tombKeys, max)
	}
}
