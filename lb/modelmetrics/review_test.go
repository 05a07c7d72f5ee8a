package modelmetrics

import (
	"net"
	"sync"
	"testing"
	"time"
)

// The text format allows blanks between a metric's name and its label
// set (Prometheus' own parsers read `name {l="v"} 1`): such a line is a
// sample like any other, not a malformed one that fails every scrape of
// the replica (which then read stale for good).
func TestParseBlanksBeforeTheLabelSet(t *testing.T) {
	body := "vllm:num_requests_waiting {model_name=\"m\"} 3\n" +
		"vllm:num_requests_running\t{model_name=\"m\"} 2\n" +
		"vllm:kv_cache_usage_perc  {model_name=\"m\"} 0.5\n" +
		"vllm:cache_config_info {block_size=\"16\",num_gpu_blocks=\"100\"} 1\n" +
		"nv_trt_llm_request_metrics {request_type=\"waiting\"} 9\n"
	s, err := Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if s.Waiting != 3 || s.Running != 2 || s.KVCacheUsage != 0.5 || s.KVBlocks != 100 || s.KVTokens != 1600 {
		t.Fatalf("got %+v", s)
	}
}

// The OnSample hook of an older scrape that is slow to run (the hook's
// consumer busy, its lock contended) must not hand its sample on after
// a newer scrape's: the consumer would keep the older view of the
// replica as its latest until the next scrape.
func TestOnSampleNeverHandsOnAnOlderSampleLast(t *testing.T) {
	f := newFakeReplica(t, vllmBody(1, 1, 0.1))
	s := New(Config{Interval: time.Hour, MinRefresh: time.Millisecond})
	var (
		mu       sync.Mutex
		last     float64 // Waiting of the sample the consumer holds
		newer    = make(chan struct{})
		started  = make(chan struct{})
		newerOne sync.Once
	)
	s.OnSample(func(_ string, smp Sample) {
		if smp.Waiting == 1 {
			close(started)
			// The first sample's hook is slow: the newer one comes meanwhile.
			select {
			case <-newer:
			case <-time.After(300 * time.Millisecond):
			}
		} else {
			newerOne.Do(func() { close(newer) })
		}
		mu.Lock()
		last = smp.Waiting
		mu.Unlock()
	})
	s.SetTargets(map[string]string{"r": f.URL})
	run(t, s)
	<-started
	f.set(vllmBody(2, 1, 0.1))
	s.RefreshTargets("r")
	waitFor(t, "the second scrape", func() bool { return f.hits.Load() >= 2 })
	time.Sleep(500 * time.Millisecond) // both hooks have run
	mu.Lock()
	defer mu.Unlock()
	if last != 2 {
		t.Fatalf("the consumer holds waiting %v (the older sample), want 2 (the newer)", last)
	}
}

// A replica that never answers holds only its own scrape, and that only
// to the Timeout: its peers are read every Interval meanwhile, and stay
// fresh.
func TestAHangingReplicaDoesNotStaleItsPeers(t *testing.T) {
	good := newFakeReplica(t, vllmBody(1, 2, 0.1))
	release := make(chan struct{})
	hang := rawReplica(t, func(net.Conn) { <-release })
	defer close(release)
	s := New(Config{Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond, Staleness: 150 * time.Millisecond})
	s.SetTargets(map[string]string{"good": good.URL, "hang": hang})
	run(t, s)
	waitFor(t, "the hanging replica's scrape to time out", func() bool {
		smp, _ := s.Get("hang")
		return smp.Err != nil
	})
	hits := good.hits.Load()
	time.Sleep(300 * time.Millisecond)
	if smp, fr := s.Get("good"); fr != Fresh || smp.Waiting != 1 {
		t.Fatalf("good replica: %v %+v, want fresh", fr, smp)
	}
	if n := good.hits.Load() - hits; n < 3 {
		t.Fatalf("good replica scraped %d times in 6 intervals beside a hanging one", n)
	}
	if _, fr := s.Get("hang"); fr != Stale {
		t.Fatalf("hanging replica reads %v, want stale", fr)
	}
}
