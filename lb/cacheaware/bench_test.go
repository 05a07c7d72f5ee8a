package cacheaware

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

const benchReplicas = 16

func benchAddrs() []string {
	a := make([]string, benchReplicas)
	for i := range a {
		a[i] = fmt.Sprintf("10.0.0.%d:8000", i)
	}
	return a
}

// corpus: 64 system prompts of 1–2 KB of words, as chat templates share.
func systemPrompts(rng *rand.Rand) []string {
	words := strings.Fields("the model should answer politely and concisely using tools when helpful never reveal secrets always cite sources prefer metric units format code blocks with language tags refuse unsafe requests")
	out := make([]string, 64)
	for i := range out {
		var sb strings.Builder
		fmt.Fprintf(&sb, "<|system|>\nYou are assistant #%d. ", i)
		n := 1024 + rng.IntN(1024)
		for sb.Len() < n {
			sb.WriteString(words[rng.IntN(len(words))])
			sb.WriteByte(' ')
		}
		out[i] = sb.String()
	}
	return out
}

func randText(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz      "[rng.IntN(32)]
	}
	return string(b)
}

// fill routes and inserts n prompts: a system prompt plus a unique ~100
// character user turn, the way requests would arrive.
func fill(r *Router, rng *rand.Rand, sys []string, n int) {
	for i := range n {
		text := sys[rng.IntN(len(sys))] + fmt.Sprintf("<|user|>\nquestion %d: ", i) + randText(rng, 80)
		d := r.Pick("model", text, nil)
		r.Insert("model", text, d.Addr)
	}
}

func filled(b *testing.B, cfg Config, n int) (*Router, []string) {
	b.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	r := New(cfg)
	r.SetReplicas(benchAddrs())
	sys := systemPrompts(rng)
	fill(r, rng, sys, n)
	return r, sys
}

// BenchmarkMatchInsert4KB: one request's work (Pick then Insert) for a new
// 4 KB prompt against a tree holding 100k prompts over 16 replicas, at the
// default bound (so inserts also evict once the tree is full).
func BenchmarkMatchInsert4KB(b *testing.B) {
	r, sys := filled(b, Config{}, 100_000)
	rng := rand.New(rand.NewPCG(1, 1))
	tail := randText(rng, 4096)
	load := func(string) (int, bool) { return 0, true }
	buf := make([]byte, 0, 8192)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		// A fresh 4 KB text each op without allocating it: the router
		// copies what it stores, so reusing the buffer is safe.
		s := sys[i%len(sys)]
		buf = append(buf[:0], s...)
		buf = fmt.Appendf(buf, "<|user|>\nbench %d: ", i)
		buf = append(buf, tail[:4096-len(buf)%4096]...)
		text := unsafe.String(&buf[0], len(buf))
		d := r.Pick("model", text, load)
		r.Insert("model", text, d.Addr)
	}
	b.StopTimer()
	s := r.Stats()
	b.ReportMetric(float64(s.Chars), "tree-chars")
	b.ReportMetric(float64(s.Nodes), "tree-nodes")
}

// BenchmarkPick4KB: Pick alone (read lock only) for a prompt whose system
// prompt is in the tree.
func BenchmarkPick4KB(b *testing.B) {
	r, sys := filled(b, Config{}, 100_000)
	rng := rand.New(rand.NewPCG(1, 1))
	texts := make([]string, 64)
	for i := range texts {
		texts[i] = sys[i] + randText(rng, 4096-len(sys[i]))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r.Pick("model", texts[i%len(texts)], nil)
	}
}

// BenchmarkMemoryPerChar reports the heap the tree takes per character it
// stores (labels, nodes, holdings, child and holder slices).
func BenchmarkMemoryPerChar(b *testing.B) {
	var perChar, perNode float64
	for b.Loop() {
		rng := rand.New(rand.NewPCG(7, 7))
		sys := systemPrompts(rng)
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		r := New(Config{})
		r.SetReplicas(benchAddrs())
		fill(r, rng, sys, 100_000)
		runtime.GC()
		runtime.ReadMemStats(&m1)
		s := r.Stats()
		heap := float64(m1.HeapAlloc) - float64(m0.HeapAlloc)
		perChar, perNode = heap/float64(s.Chars), heap/float64(s.Nodes)
		runtime.KeepAlive(r)
	}
	b.ReportMetric(perChar, "heap-B/char")
	b.ReportMetric(perNode, "heap-B/node")
}

// BenchmarkEvict1M: evicting one million characters (LRU, leaf-first,
// batched) from a tree of ~2M characters of 100-character user turns
// under 64 shared system prompts, over 16 replicas. Between timed
// evictions, the next prompts of a pool (evicted long ago) refill it.
func BenchmarkEvict1M(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 7))
	sys := systemPrompts(rng)
	pool := make([]string, 30_000)
	for i := range pool {
		pool[i] = sys[rng.IntN(len(sys))] + fmt.Sprintf("<|user|>\nq%06d: ", i) + randText(rng, 88)
	}
	addrs := benchAddrs()
	r := New(Config{})
	r.SetReplicas(addrs)
	next := 0
	refill := func(chars int) {
		for r.Stats().Chars < chars {
			for range 100 {
				r.Insert("model", pool[next%len(pool)], addrs[next%len(addrs)])
				next++
			}
		}
	}
	refill(2_000_000)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		before := r.Stats().Chars
		r.evictTo(context.Background(), before-1_000_000)
		b.StopTimer()
		if after := r.Stats().Chars; before-after < 1_000_000 {
			b.Fatalf("evicted %d chars", before-after)
		}
		refill(2_000_000)
		b.StartTimer()
	}
}

// BenchmarkPickDuringEviction runs Picks on one goroutine (more would
// measure the scheduler's time slices on small machines, not the lock)
// while the tree is
// trimmed by 8M characters, and reports the longest single Pick: with
// batched eviction (EvictOnce's way) and, for comparison in the same run,
// with the whole eviction under one lock hold. Reported, not asserted:
// timings on shared machines are noisy.
func BenchmarkPickDuringEviction(b *testing.B) {
	for _, mode := range []string{"batched", "one-lock-hold"} {
		b.Run(mode, func(b *testing.B) {
			var maxPick, evictDur time.Duration // worst over iterations, last
			for b.Loop() {
				r, sys := filled(b, Config{}, 100_000)
				target := r.Stats().Chars - 8_000_000
				var stop atomic.Bool
				var mu sync.Mutex
				var worst time.Duration
				var wg sync.WaitGroup
				runtime.GC()
				for g := range 1 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						text := sys[g] + "<|user|>\nhello"
						local := time.Duration(0)
						for !stop.Load() {
							t0 := time.Now()
							r.Pick("model", text, nil)
							local = max(local, time.Since(t0))
						}
						mu.Lock()
						worst = max(worst, local)
						mu.Unlock()
					}()
				}
				time.Sleep(10 * time.Millisecond) // let the pickers start
				t0 := time.Now()
				if mode == "batched" {
					r.evictTo(context.Background(), target)
				} else {
					r.mu.Lock()
					r.evictLocked(target, -1)
					r.mu.Unlock()
				}
				evictDur = time.Since(t0)
				stop.Store(true)
				wg.Wait()
				maxPick = max(maxPick, worst)
			}
			b.ReportMetric(float64(maxPick.Microseconds()), "max-pick-µs")
			b.ReportMetric(float64(evictDur.Microseconds()), "evict8M-µs")
		})
	}
}
