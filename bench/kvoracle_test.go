package bench

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func kvReq(prefix, n, shared, own int) []kvBlock {
	var bs []kvBlock
	for i := range shared {
		bs = append(bs, kvBlock{prefix, i})
	}
	for i := range own {
		bs = append(bs, kvBlock{-1 - n, shared + i})
	}
	return bs
}

// The cache model keeps the sim's rules: every cached block counts (not
// only a leading run), a finished request's blocks are evicted oldest
// first, running requests' blocks are never evicted, and a request whose
// blocks do not fit beside the running ones is refused.
func TestKVCacheModel(t *testing.T) {
	c := newKVCacheModel(6, 1)
	a := kvReq(0, 0, 3, 1)
	if got, ok := c.start(a); !ok || got != 0 {
		t.Fatalf("first request: %d cached, %v", got, ok)
	}
	c.finish(a, 1)
	b := kvReq(1, 1, 3, 1) // 4 new blocks, 2 free: two of a's 4 evicted
	if got, ok := c.start(b); !ok || got != 0 {
		t.Fatalf("second request: %d cached, %v", got, ok)
	}
	if len(c.unused) != 2 || len(c.used) != 4 {
		t.Fatalf("after eviction: %d unused, %d used", len(c.unused), len(c.used))
	}
	// a again, while b runs: its 2 surviving blocks are hits wherever they
	// are in the prompt; its other blocks (3 new: 2 shared, 1 own) do not
	// fit beside b's 4 running ones and the 2 it reuses.
	a2 := kvReq(0, 2, 3, 0)
	survivors := 0
	for _, bl := range a2 {
		if _, ok := c.unused[bl]; ok {
			survivors++
		}
	}
	if _, ok := c.start(append(a2, kvBlock{-99, 9})); ok {
		t.Fatal("a request that cannot fit beside the running ones was admitted")
	}
	c.finish(b, 2)
	if got, ok := c.start(a2); !ok || got != survivors {
		t.Fatalf("a again: %d cached, want the %d surviving shared blocks (%v)", got, survivors, ok)
	}
	// b's blocks are now the oldest unused, a2's are running: what a2
	// stored evicted b's, never a2's.
	for _, bl := range a2 {
		if c.used[bl] != 1 {
			t.Fatalf("block %v of the running request not held", bl)
		}
	}
}

// The planned oracle on mixed caches: the big caches get more prefixes than
// the small ones, no engine gets more than its share, and its replay holds
// more than prefixes dealt round robin (what a hash of the prefix does on
// average).
func TestKVOraclePlan(t *testing.T) {
	k := kvBench{replicas: 2, prefixes: 8, prefixWords: 64, uniqueWords: 16, maxTokens: 2, blockSize: 16,
		maxNumSeqs: 2, prefillToken: 100 * time.Microsecond, interToken: time.Millisecond, seed: 5}
	sizes := []int{10, 26} // 4-block prefixes: 2 fit in the small cache, 6 in the big one
	arrivals := poisson(20, 20*time.Second, 3)
	prefix := make([]int, len(arrivals))
	for i := range prefix {
		prefix[i] = int(mix64(uint64(i)) % uint64(k.prefixes))
	}
	plan, got := kvOraclePlan(k, sizes, arrivals, prefix)
	small := 0
	for _, e := range plan {
		if e == 0 {
			small++
		}
	}
	if small >= k.prefixes/2 {
		t.Errorf("plan %v: %d of %d prefixes on the small cache", plan, small, k.prefixes)
	}
	limit := int(oracleShare * float64(len(prefix)) / float64(k.replicas))
	if slices.Max(got.perEngine) > limit || got.perEngine[0]+got.perEngine[1] != len(prefix) {
		t.Errorf("requests per engine %v, limit %d of %d", got.perEngine, limit, len(prefix))
	}
	rr := make([]int, k.prefixes)
	for p := range rr {
		rr[p] = p % k.replicas
	}
	if base := kvReplayPlan(k, sizes, arrivals, prefix, rr, k.seed); got.cached <= base.cached {
		t.Errorf("oracle %d cached blocks (%.3f), round robin %d (%.3f)", got.cached, got.rate(), base.cached, base.rate())
	}
	again, _ := kvOraclePlan(k, sizes, arrivals, prefix)
	if !slices.Equal(plan, again) {
		t.Errorf("plan not reproducible: %v then %v", plan, again)
	}
}

// The oracle's Caddy site routes on the header alone, in order, and
// refuses a request without it.
func TestOracleProxy(t *testing.T) {
	got := oracleProxy([]string{"127.0.0.1:1", "127.0.0.1:2"})
	want := "route {\n\t@home0 header X-Oracle-Home 0\n\treverse_proxy @home0 127.0.0.1:1\n" +
		"\t@home1 header X-Oracle-Home 1\n\treverse_proxy @home1 127.0.0.1:2\n\trespond \"no X-Oracle-Home\" 421\n}"
	if got != want || strings.Count(got, "reverse_proxy") != 2 {
		t.Errorf("site:\n%s", got)
	}
}
