package caddymodule

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb/cacheaware"
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
	release, stats, err := attachKVEvents("kvpeer", kvEventsOptions{KVEvents: "tcp://" + freeKVAddr(t),
		KVEventsTokenizer: kvTokenizerLLMDSim}, pk, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	text := strings.Repeat("one shared prompt of many words ", 16)
	for i := 0; i < 100; i++ {
		pk.PeerRouted("m", text, fmt.Sprintf("evil-%d:%s", i, strings.Repeat("x", 64)), false)
	}
	pk.PeerRouted("m", text, "10.0.0.2:8000", false)
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
