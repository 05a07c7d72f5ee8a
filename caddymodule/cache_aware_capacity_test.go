package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// cache_aware with kv_events reads each replica's KV cache size from its
// engine's metrics, and health shows it.
func TestKVCapacityFromEngineMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, `vllm:num_requests_waiting{model_name="m"} 0`)
		fmt.Fprintln(w, `vllm:cache_config_info{block_size="16",num_gpu_blocks="232"} 1`)
	}))
	defer srv.Close()
	dial := strings.TrimPrefix(srv.URL, "http://")

	c := newKVCapacity()
	c.SetBackends([]lb.Backend{{URL: srv.URL, Dial: dial}, {URL: "http://127.0.0.1:1", Dial: "127.0.0.1:1"}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.run(func(ctx context.Context) { <-ctx.Done() })(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(20 * time.Second) // the first scrape is at once; this only bounds a hang
	for {
		if n, ok := c.Tokens(dial); ok {
			if n != 232*16 {
				t.Fatalf("tokens %d, want 232 blocks of 16", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("capacity never read")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n, ok := c.Tokens("127.0.0.1:1"); ok {
		t.Fatalf("a replica without metrics has capacity %d", n)
	}
	s := &KVEventsStats{Replicas: map[string]KVEventsReplica{dial: {Mode: "exact", Blocks: 7}}}
	c.fill(s, []string{dial, "127.0.0.1:1"})
	if r := s.Replicas[dial]; r.Capacity != 232*16 || r.Blocks != 7 || r.Mode != "exact" {
		t.Fatalf("health entry %+v", r)
	}
	if _, ok := s.Replicas["127.0.0.1:1"]; ok {
		t.Fatalf("unknown capacity shown: %+v", s.Replicas)
	}
}

// An SGLang engine's size is its max_total_num_tokens, in the unit a vLLM
// engine's blocks are converted to: one pool can mix the two.
func TestKVCapacityFromSGLangMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `sglang:num_queue_reqs{model_name="m"} 0`)
		fmt.Fprintln(w, `sglang:max_total_num_tokens{model_name="m"} 161721.0`)
	}))
	defer srv.Close()
	dial := strings.TrimPrefix(srv.URL, "http://")
	c := newKVCapacity()
	c.SetBackends([]lb.Backend{{URL: srv.URL, Dial: dial}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.run(func(ctx context.Context) { <-ctx.Done() })(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(20 * time.Second) // bounds a hang only
	for {
		if n, ok := c.Tokens(dial); ok {
			if n != 161721 {
				t.Fatalf("tokens %d, want 161721", n)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("capacity never read")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
