package qll

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// spreadOverEqualEngines sends n requests, open loop (Poisson arrivals at
// rate per unit of virtual time), to identical batching replicas that
// never fill: each request takes service × a lognormal noise (σ 0.3, as
// the first token of a real engine varies with its step's phase and the
// prefix cache), whatever else runs there. The response begins after a
// tenth of it. It returns the requests each replica got and how many
// found no free slot on arrival (and waited for one).
func spreadOverEqualEngines(t *testing.T, replicas, n int, rate float64) (map[string]int, int) {
	t.Helper()
	s := New(Config{QueueMaxSize: -1}) // refuse instead of queueing: the test is the queue
	t.Cleanup(s.Close)
	var addrs []string
	for i := range replicas {
		addrs = append(addrs, string(rune('a'+i))+":1")
	}
	s.SetReplicas(addrs)
	rng := rand.New(rand.NewPCG(1, 2))
	type event struct {
		at    float64
		l     *Lease
		start float64
		first bool // the response's first byte (else its end)
		total float64
	}
	var events []event // pending first bytes and ends
	per, waited := map[string]int{}, 0
	var backlog []float64 // arrival times of requests that found no slot
	dispatch := func(now float64) {
		for len(backlog) > 0 {
			l, err := s.Acquire(context.Background())
			if errors.Is(err, lb.ErrQueueFull) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			backlog = backlog[1:]
			per[l.Addr]++
			d := math.Exp(0.3 * rng.NormFloat64())
			events = append(events, event{at: now + d/10, l: l, start: now, first: true}, event{at: now + d, l: l, start: now, total: d})
		}
	}
	now, next := 0.0, rng.ExpFloat64()/rate
	for sent := 0; sent < n || len(events) > 0; {
		i := -1
		for j := range events {
			if i < 0 || events[j].at < events[i].at {
				i = j
			}
		}
		if sent < n && (i < 0 || next <= events[i].at) {
			now = next
			next += rng.ExpFloat64() / rate
			sent++
			if len(backlog) > 0 {
				waited++
			}
			backlog = append(backlog, now)
			before := len(backlog)
			dispatch(now)
			if len(backlog) == before && before == 1 {
				waited++
			}
			continue
		}
		e := events[i]
		events = append(events[:i], events[i+1:]...)
		now = e.at
		d := time.Duration((e.at - e.start) * float64(time.Second))
		if e.first {
			e.l.FirstByte(d)
		} else {
			e.l.Release(lb.Outcome{Kind: lb.Success, Streamed: true, Latency: time.Duration(e.total / 10 * float64(time.Second)), Total: d})
		}
		dispatch(now)
	}
	return per, waited
}

// On identical replicas with room, queued_least_latency spreads requests
// like round robin: a replica whose EWMA happens to be low must not take
// request after request (the latency ranking is noise there; the
// in-flight count is exact). Round robin gives each of 4 replicas 1,000
// of 4,000; before in-flight counts ranked first, the lowest EWMA took
// most of them.
func TestIdenticalEnginesShareLikeRoundRobin(t *testing.T) {
	per, waited := spreadOverEqualEngines(t, 4, 4000, 40)
	lo, hi := 4000, 0
	for _, c := range per {
		lo, hi = min(lo, c), max(hi, c)
	}
	if len(per) != 4 || hi-lo > 40 {
		t.Fatalf("4,000 requests over 4 identical replicas: %v (spread %d), want within 40 of each other like round robin", per, hi-lo)
	}
	if waited > 40 {
		t.Fatalf("%d of 4,000 requests found no free slot on replicas that never fill", waited)
	}
}

// An engine ends together the requests it admitted together: the replica
// they leave emptier takes some of the next requests, not all of them in
// a row (they would end together again, and so on), while the others are
// loaded about as much.
func TestABatchThatEndsTogetherDoesNotTakeEveryNextRequest(t *testing.T) {
	s := New(Config{Parallelism: 64})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1", "b:1", "c:1", "d:1"})
	held := map[string][]*Lease{}
	for range 40 {
		l := mustAcquire(t, s)
		held[l.Addr] = append(held[l.Addr], l)
	}
	for _, a := range []string{"a:1", "b:1", "c:1", "d:1"} {
		if len(held[a]) != 10 {
			t.Fatalf("40 requests over 4 idle replicas: %s got %d, want 10", a, len(held[a]))
		}
	}
	for _, l := range held["a:1"][:4] { // a's first four end in one step
		l.Release(lb.Outcome{Kind: lb.Success, Streamed: true, Latency: 100 * time.Millisecond, Total: time.Second})
	}
	held["a:1"] = held["a:1"][4:]
	var next []string
	for range 4 {
		l := mustAcquire(t, s)
		next = append(next, l.Addr)
		held[l.Addr] = append(held[l.Addr], l)
	}
	if a := slices.IndexFunc(next, func(s string) bool { return s != "a:1" }); a < 0 {
		t.Fatalf("after 4 of a's 10 requests ended, the next 4 went %v: all to a", next)
	}
	for _, ls := range held {
		for _, l := range ls {
			l.Release(lb.Outcome{Kind: lb.Cancelled})
		}
	}
}

// Between batches loaded alike, a replica measured slower beyond the
// noise of its EWMA gets the request; measured alike, they take turns.
func TestABatchMeasuredSlowerBeyondNoiseGetsLess(t *testing.T) {
	s := New(Config{Parallelism: 8})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"fast:1", "slow:1"})
	teach := func(addr string, d time.Duration) { teachEWMA(t, s, addr, d) }
	for range 5 { // steady samples: EWMAs of 100 and 200 ms, little noise
		teach("fast:1", 100*time.Millisecond)
		teach("slow:1", 200*time.Millisecond)
	}
	a, b := mustAcquire(t, s), mustAcquire(t, s) // one each: loaded alike
	if a.Addr == b.Addr {
		t.Fatalf("two requests over two idle replicas both went to %s", a.Addr)
	}
	l := mustAcquire(t, s)
	if l.Addr != "fast:1" {
		t.Fatalf("one request in flight on each, fast (100 ms) and slow (200 ms): the third went to %s", l.Addr)
	}
	for _, x := range []*Lease{a, b, l} {
		x.Release(lb.Outcome{Kind: lb.Cancelled})
	}
}

// Between batches loaded alike, EWMAs within the swing of identical
// engines (a step's phase, a cold prefix: 30% and more) are not a slower
// replica, however steady their samples: the two take turns. Ranked on
// any difference beyond the EWMAs' own noise, the calibrated engine's
// replicas at R = 4 took 2-3 requests in a row whenever one's EWMA
// dipped (several prefills in one step) and their in-flight counts
// drifted up to √least apart: TTFT p90/p99 above round robin's.
func TestBatchesWithinTheSwingOfIdenticalEnginesTakeTurns(t *testing.T) {
	s := New(Config{Parallelism: 8})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1", "b:1"})
	teach := func(addr string, d time.Duration) { teachEWMA(t, s, addr, d) }
	for range 5 { // steady samples: EWMAs of 100 and 125 ms, little noise
		teach("a:1", 100*time.Millisecond)
		teach("b:1", 125*time.Millisecond)
	}
	var held []*Lease
	got := map[string]int{}
	for range 6 {
		l := mustAcquire(t, s)
		held = append(held, l)
		got[l.Addr]++
	}
	if got["a:1"] != 3 || got["b:1"] != 3 {
		t.Fatalf("6 requests over two batches measured 100 and 125 ms: %v, want 3 each", got)
	}
	for _, l := range held {
		l.Release(lb.Outcome{Kind: lb.Cancelled})
	}
}

// Between batches a replica two requests above the least loaded one
// waits its turn, even when it got a request longest ago: in-flight
// counts stay within one of each other, as round robin keeps identical
// engines. A band of √least let them drift apart (16 against 20) while
// the engines ran near their KV bound: at R = 4 the more loaded one
// evicted prefixes and its TTFT p99 was 1.1× round robin's.
func TestABatchTwoAboveTheLeastWaitsItsTurn(t *testing.T) {
	s := New(Config{Parallelism: 64})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1", "b:1"})
	held := map[string][]*Lease{}
	for range 37 { // a 19, b 18: a picked last
		l := mustAcquire(t, s)
		held[l.Addr] = append(held[l.Addr], l)
	}
	if len(held["a:1"]) != 19 || len(held["b:1"]) != 18 {
		t.Fatalf("setup: a %d, b %d in flight; want 19, 18", len(held["a:1"]), len(held["b:1"]))
	}
	for _, l := range held["a:1"][:3] { // a 16, b 18: b picked longest ago
		l.Release(lb.Outcome{Kind: lb.Cancelled})
	}
	held["a:1"] = held["a:1"][3:]
	if l := mustAcquire(t, s); l.Addr != "a:1" {
		t.Fatalf("16 in flight on a, 18 on b: the next went to %s, want a", l.Addr)
	} else {
		held["a:1"] = append(held["a:1"], l)
	}
	for _, ls := range held {
		for _, l := range ls {
			l.Release(lb.Outcome{Kind: lb.Cancelled})
		}
	}
}

// teachEWMA gives addr one successful request of duration d; the leases
// picked for other replicas on the way are held until addr is picked,
// then cancelled (they teach nothing and leave nothing in flight).
func teachEWMA(t *testing.T, s *State, addr string, d time.Duration) {
	t.Helper()
	var others []*Lease
	defer func() {
		for _, l := range others {
			l.Release(lb.Outcome{Kind: lb.Cancelled})
		}
	}()
	for {
		l := mustAcquire(t, s)
		if l.Addr == addr {
			l.Release(success(d))
			return
		}
		others = append(others, l)
	}
}

// Two streaming engines with as many requests in flight differ when one
// has begun answering all of its requests and the other none: the second
// is stalling (near its KV bound an engine admits no one for a second),
// and new requests go to the first until the two are waiting alike. On
// four calibrated engines this took qll's TTFT p99 from 0.88 s to 0.64 s
// (round robin 0.52 s).
func TestAStallingEngineWaitsForItsPrefillsToCatchUp(t *testing.T) {
	s := New(Config{Parallelism: 64})
	t.Cleanup(s.Close)
	s.SetReplicas([]string{"a:1", "b:1"})
	held := map[string][]*Lease{}
	for range 8 {
		l := mustAcquire(t, s)
		held[l.Addr] = append(held[l.Addr], l)
	}
	if len(held["a:1"]) != 4 || len(held["b:1"]) != 4 {
		t.Fatalf("8 requests over 2 idle replicas: a %d, b %d", len(held["a:1"]), len(held["b:1"]))
	}
	for _, l := range held["a:1"] {
		l.FirstByte(300 * time.Millisecond) // a streams all of its requests; b none yet
	}
	for i := range 2 {
		l := mustAcquire(t, s)
		held[l.Addr] = append(held[l.Addr], l)
		if l.Addr != "a:1" {
			t.Fatalf("request %d went to b, which has begun none of its 4 requests (a: all of them)", i+1)
		}
	}
	for _, ls := range held {
		for _, l := range ls {
			l.Release(lb.Outcome{Kind: lb.Cancelled})
		}
	}
}
