package qll

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

func success(d time.Duration) lb.Outcome { return lb.Outcome{Kind: lb.Success, Latency: d} }

// waitFor polls cond; it only bounds how long a broken test hangs.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func mustAcquire(t *testing.T, s *State) *Lease {
	t.Helper()
	l, err := s.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return l
}

type result struct {
	id    int
	lease *Lease
	err   error
}

// enqueue starts n waiters one after another (each in the queue before the
// next starts), so their FIFO order is known.
func enqueue(t *testing.T, s *State, ctx context.Context, n int) <-chan result {
	t.Helper()
	out := make(chan result, n)
	for i := 0; i < n; i++ {
		depth := s.Snapshot().QueueDepth
		go func(id int) {
			l, err := s.Acquire(ctx)
			out <- result{id, l, err}
		}(i)
		waitFor(t, "waiter to queue", func() bool { return s.Snapshot().QueueDepth > depth })
	}
	return out
}

func TestDispatchIsFIFO(t *testing.T) {
	s := New(Config{MaxConcurrency: 1})
	s.SetReplicas([]string{"a:1"})
	cur := mustAcquire(t, s)
	got := enqueue(t, s, context.Background(), 5)
	for want := 0; want < 5; want++ {
		cur.Release(success(10 * time.Millisecond))
		r := <-got
		if r.err != nil || r.id != want {
			t.Fatalf("dispatch %d: got waiter %d (err %v)", want, r.id, r.err)
		}
		cur = r.lease
	}
	cur.Release(success(time.Millisecond))
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight after all releases = %d", n)
	}
}

func TestFullQueueEvictsOldest(t *testing.T) {
	s := New(Config{MaxConcurrency: 1, QueueMaxSize: 2})
	s.SetReplicas([]string{"a:1"})
	busy := mustAcquire(t, s)
	first := enqueue(t, s, context.Background(), 2)
	third := make(chan result, 1)
	go func() {
		l, err := s.Acquire(context.Background())
		third <- result{2, l, err}
	}()
	r := <-first
	if r.id != 0 || !errors.Is(r.err, lb.ErrEvicted) {
		t.Fatalf("oldest waiter: got id %d err %v, want id 0 evicted", r.id, r.err)
	}
	if d := s.Snapshot().QueueDepth; d != 2 {
		t.Fatalf("queue depth after eviction = %d, want 2", d)
	}
	busy.Release(success(time.Millisecond))
	r = <-first
	if r.id != 1 || r.err != nil {
		t.Fatalf("second waiter: id %d err %v", r.id, r.err)
	}
	r.lease.Release(success(time.Millisecond))
	r = <-third
	if r.err != nil {
		t.Fatalf("third waiter: %v", r.err)
	}
	r.lease.Release(success(time.Millisecond))
	c := s.Snapshot().Counters
	if c.Evicted != 1 || c.Dispatched != 3 || s.TotalInFlight() != 0 {
		t.Fatalf("counters %+v in flight %d", c, s.TotalInFlight())
	}
}

func TestQueueDisabledRefusesAtOnce(t *testing.T) {
	s := New(Config{MaxConcurrency: 1, QueueMaxSize: -1})
	s.SetReplicas([]string{"a:1"})
	l := mustAcquire(t, s)
	if _, err := s.Acquire(context.Background()); !errors.Is(err, lb.ErrQueueFull) {
		t.Fatalf("got %v, want ErrQueueFull", err)
	}
	l.Release(success(time.Millisecond))
}

func TestQueueTimeout(t *testing.T) {
	s := New(Config{MaxConcurrency: 1, QueueTimeout: 20 * time.Millisecond})
	s.SetReplicas([]string{"a:1"})
	l := mustAcquire(t, s)
	if _, err := s.Acquire(context.Background()); !errors.Is(err, lb.ErrQueueTimeout) {
		t.Fatalf("got %v, want ErrQueueTimeout", err)
	}
	snap := s.Snapshot()
	if snap.QueueDepth != 0 || snap.Counters.TimedOut != 1 {
		t.Fatalf("after timeout: depth %d counters %+v", snap.QueueDepth, snap.Counters)
	}
	l.Release(success(time.Millisecond))
	if s.TotalInFlight() != 0 {
		t.Fatal("leaked in-flight count")
	}
}

func TestCancelledWaiterLeavesAtOnceAndIsNeverDispatched(t *testing.T) {
	s := New(Config{MaxConcurrency: 1})
	s.SetReplicas([]string{"a:1"})
	busy := mustAcquire(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	gone := enqueue(t, s, ctx, 1)
	stays := enqueue(t, s, context.Background(), 1)
	cancel()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter got %v", r.err)
	}
	if d := s.Snapshot().QueueDepth; d != 1 {
		t.Fatalf("queue depth after cancel = %d, want 1", d)
	}
	busy.Release(success(time.Millisecond))
	r := <-stays
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.lease.Release(success(time.Millisecond))
	c := s.Snapshot().Counters
	if c.Cancelled != 1 || c.Dispatched != 2 || s.TotalInFlight() != 0 {
		t.Fatalf("counters %+v in flight %d", c, s.TotalInFlight())
	}
}

func TestNoBackendsFailsFastAndFailsWaiters(t *testing.T) {
	s := New(Config{})
	if _, err := s.Acquire(context.Background()); !errors.Is(err, lb.ErrNoBackends) {
		t.Fatalf("empty pool: got %v", err)
	}
	s.Configure(Config{MaxConcurrency: 1})
	s.SetReplicas([]string{"a:1"})
	l := mustAcquire(t, s)
	w := enqueue(t, s, context.Background(), 2)
	s.SetReplicas(nil)
	for i := 0; i < 2; i++ {
		if r := <-w; !errors.Is(r.err, lb.ErrNoBackends) {
			t.Fatalf("waiter %d got %v, want ErrNoBackends", r.id, r.err)
		}
	}
	// The removed replica still drains its request, then is forgotten.
	if snap := s.Snapshot(); snap.Draining != 1 {
		t.Fatalf("draining = %d, want 1", snap.Draining)
	}
	l.Release(success(time.Millisecond))
	if snap := s.Snapshot(); len(snap.Replicas) != 0 {
		t.Fatalf("removed replica not forgotten: %+v", snap.Replicas)
	}
}

func TestAddedReplicasDrainTheQueueAtOnce(t *testing.T) {
	// One diffusion-like replica, its EWMA (1s) far over the threshold:
	// it serves one request at a time and the rest wait at the edge.
	s := New(Config{LatencyThreshold: 100 * time.Millisecond, Parallelism: 1})
	s.SetReplicas([]string{"a:1"})
	l := mustAcquire(t, s)
	l.Release(success(time.Second))
	busy := mustAcquire(t, s)
	w := enqueue(t, s, context.Background(), 5)

	s.SetReplicas([]string{"a:1", "b:1", "c:1"})
	got := map[string]int{}
	var leases []*Lease
	for i := 0; i < 2; i++ {
		r := <-w
		if r.err != nil {
			t.Fatal(r.err)
		}
		got[r.lease.Addr]++
		leases = append(leases, r.lease)
	}
	if got["b:1"] != 1 || got["c:1"] != 1 {
		t.Fatalf("new replicas should take one request each, got %v", got)
	}
	if d := s.Snapshot().QueueDepth; d != 3 {
		t.Fatalf("queue depth = %d, want 3 (new replicas are not flooded)", d)
	}
	for _, l := range append(leases, busy) {
		l.Release(success(time.Second))
	}
	for i := 0; i < 3; i++ {
		r := <-w
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.lease.Release(success(time.Second))
	}
	if s.TotalInFlight() != 0 {
		t.Fatal("leaked in-flight count")
	}
}

func TestLoadSpreadsWhileUnderThreshold(t *testing.T) {
	s := New(Config{LatencyThreshold: 3 * time.Second, Parallelism: 1}) // the HF rule; replicas at ~200ms: all under it
	addrs := []string{"a:1", "b:1", "c:1", "d:1"}
	s.SetReplicas(addrs)
	for i, a := range addrs { // teach each replica a slightly different EWMA
		_ = a
		l := mustAcquire(t, s)
		l.Release(success(time.Duration(200+i) * time.Millisecond))
	}
	per := map[string]int{}
	var leases []*Lease
	for i := 0; i < 8; i++ {
		l := mustAcquire(t, s)
		per[l.Addr]++
		leases = append(leases, l)
	}
	for _, a := range addrs {
		if per[a] != 2 {
			t.Fatalf("8 requests over 4 equal replicas: got %v, want 2 each (no herding)", per)
		}
	}
	for _, l := range leases {
		l.Release(success(200 * time.Millisecond))
	}
}

func TestFailuresNeverFeedEWMAAndMarkDownUntilRecovery(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New(Config{FailDuration: 10 * time.Second})
	s.now = func() time.Time { return now }
	s.SetReplicas([]string{"bad:1", "good:1"})
	for _, lat := range []time.Duration{time.Second, time.Second} {
		l := mustAcquire(t, s)
		l.Release(success(lat))
	}
	// Find a lease on bad:1 and fail it (a transport error answers fast).
	var l *Lease
	for l == nil || l.Addr != "bad:1" {
		if l != nil {
			l.Release(success(time.Second))
		}
		l = mustAcquire(t, s)
	}
	l.Release(lb.Outcome{Kind: lb.Failure})
	snap := s.Snapshot()
	bad := snap.Replicas[0]
	if bad.EWMASeconds != 1 || !bad.Down || bad.Failures != 1 {
		t.Fatalf("after failure: %+v (EWMA must stay 1s, replica down)", bad)
	}
	for i := 0; i < 3; i++ {
		l := mustAcquire(t, s)
		if l.Addr != "good:1" {
			t.Fatalf("down replica got traffic")
		}
		l.Release(success(time.Second))
	}
	now = now.Add(11 * time.Second) // down time over: bad:1 gets a probe
	var probe *Lease
	var others []*Lease
	for probe == nil {
		l := mustAcquire(t, s)
		if l.Addr == "bad:1" {
			probe = l
		} else {
			others = append(others, l)
		}
	}
	probe.Release(success(time.Second))
	for _, o := range others {
		o.Release(success(time.Second))
	}
	if r := s.Snapshot().Replicas[0]; r.Down || r.ConsecFails != 0 {
		t.Fatalf("replica did not recover after a successful probe: %+v", r)
	}
}

func TestCancelledAttemptsDoNotTouchTheReplica(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a:1"})
	l := mustAcquire(t, s)
	l.Release(lb.Outcome{Kind: lb.Cancelled})
	r := s.Snapshot().Replicas[0]
	if r.Tried || r.Failures != 0 || r.Down {
		t.Fatalf("cancelled attempt changed the replica: %+v", r)
	}
}

func TestReleaseIsExactlyOnce(t *testing.T) {
	s := New(Config{})
	s.SetReplicas([]string{"a:1"})
	l := mustAcquire(t, s)
	var wg sync.WaitGroup
	var wins sync.Map
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if l.Release(success(time.Millisecond)) {
				wins.Store(i, true)
			}
		}(i)
	}
	wg.Wait()
	n := 0
	wins.Range(func(_, _ any) bool { n++; return true })
	if n != 1 || s.TotalInFlight() != 0 {
		t.Fatalf("%d releases took effect, in flight %d", n, s.TotalInFlight())
	}
}

func TestDownReplicaRecoveryWakesWaiters(t *testing.T) {
	s := New(Config{FailDuration: 30 * time.Millisecond})
	s.SetReplicas([]string{"a:1"})
	l := mustAcquire(t, s)
	w := enqueue(t, s, context.Background(), 1)
	l.Release(lb.Outcome{Kind: lb.Failure})
	r := <-w // woken by the recovery timer, not by another release
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.lease.Release(success(time.Millisecond))
}

// TestChurnKeepsCountsExact hammers the state from many goroutines, with
// cancellations, timeouts, evictions and set-backends churn, and checks the
// invariant every operator relies on: afterwards nothing is in flight,
// nothing is queued, and every dispatch was released exactly once.
func TestChurnKeepsCountsExact(t *testing.T) {
	s := New(Config{MaxConcurrency: 2, QueueMaxSize: 8, QueueTimeout: 30 * time.Millisecond, LatencyThreshold: time.Millisecond})
	sets := [][]string{{"a:1", "b:1"}, {"b:1", "c:1", "d:1"}, {"a:1"}, {"c:1", "e:1"}}
	s.SetReplicas(sets[0])
	var released, dispatched sync.WaitGroup
	var mu sync.Mutex
	releases := 0
	stop := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				s.SetReplicas(sets[i%len(sets)])
			}
		}
	}()
	for g := 0; g < 16; g++ {
		dispatched.Add(1)
		go func(g int) {
			defer dispatched.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := 0; i < 150; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(20))*time.Millisecond)
				l, err := s.Acquire(ctx)
				cancel()
				if err != nil {
					continue
				}
				released.Add(1)
				hold := time.Duration(rng.IntN(500)) * time.Microsecond
				kind := []lb.OutcomeKind{lb.Success, lb.Failure, lb.Cancelled}[rng.IntN(3)]
				go func() {
					defer released.Done()
					time.Sleep(hold)
					if l.Release(lb.Outcome{Kind: kind, Latency: time.Millisecond}) {
						mu.Lock()
						releases++
						mu.Unlock()
					}
				}()
			}
		}(g)
	}
	dispatched.Wait()
	released.Wait()
	close(stop)
	snap := s.Snapshot()
	if snap.QueueDepth != 0 || s.TotalInFlight() != 0 {
		t.Fatalf("after churn: queue %d, in flight %d", snap.QueueDepth, s.TotalInFlight())
	}
	// Leases dispatched to a waiter whose client had just left are released
	// by the state itself; every other one by the test, exactly once.
	if snap.Counters.Released != snap.Counters.Dispatched || uint64(releases) > snap.Counters.Released {
		t.Fatalf("dispatched %d, released %d (by the test: %d)", snap.Counters.Dispatched, snap.Counters.Released, releases)
	}
	t.Logf("counters: %+v", snap.Counters)
}

func BenchmarkPick64(b *testing.B) {
	s := New(Config{})
	addrs := make([]string, 64)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.0.%d:8000", i)
	}
	s.SetReplicas(addrs)
	for i := range addrs {
		l, _ := s.Acquire(context.Background())
		l.Release(success(time.Duration(100+i) * time.Millisecond))
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := s.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		l.Release(success(150 * time.Millisecond))
	}
}

func TestEWMAIsNormalisedByTheLoadARequestJoined(t *testing.T) {
	// A one-at-a-time replica: the second request queues behind the first
	// and takes two service times. Its sample must count as one service
	// time, or the prediction (EWMA × load) would count the queue twice.
	s := New(Config{EWMAAlpha: 1, LatencyThreshold: 3 * time.Second, Parallelism: 1})
	s.SetReplicas([]string{"a:1"})
	mustAcquire(t, s).Release(success(time.Second)) // learn: 1s per request
	first := mustAcquire(t, s)
	second := mustAcquire(t, s) // predicted 2s, under the 3s threshold: joins the replica's queue
	first.Release(success(time.Second))
	second.Release(success(2 * time.Second))
	if got := s.Snapshot().Replicas[0].EWMASeconds; got != 1 {
		t.Fatalf("EWMA = %v, want 1 (the second sample normalised by 2 rounds)", got)
	}
}

func TestAFreeSlotIsEligibleWhateverTheEWMA(t *testing.T) {
	// A batching replica (4 at once) whose requests take 5 s, over the 3 s
	// threshold: like an idle one-at-a-time replica, it takes a request
	// while it has a free slot — 4 at once, not 1 — and the fifth waits.
	s := New(Config{Parallelism: 4, EWMAAlpha: 1})
	s.SetReplicas([]string{"a:1"})
	mustAcquire(t, s).Release(success(5 * time.Second))
	var held []*Lease
	for i := 0; i < 4; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // only a hang guard
		l, err := s.Acquire(ctx)
		cancel()
		if err != nil {
			t.Fatalf("request %d of 4 was not dispatched to a replica with a free slot: %v", i+1, err)
		}
		held = append(held, l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx); err == nil {
		t.Fatal("a fifth request went to a replica with no free slot predicted at 10 s")
	}
	for _, l := range held {
		l.Release(success(5 * time.Second))
	}
}

// A retry that waits in the queue is never dispatched to the replica it
// failed on: when that replica frees a slot the request behind it takes
// it, and the retry gets the next slot of another replica. A retry left
// with no other replica is answered lb.ErrAllDown (the adapter then asks
// again without its avoid list), not held.
func TestAQueuedRetryWaitsForAnotherReplica(t *testing.T) {
	s := New(Config{Parallelism: 1, MaxFails: 100})
	s.SetReplicas([]string{"a:1", "b:1"})
	la, lb1 := mustAcquire(t, s), mustAcquire(t, s)
	if la.Addr == lb1.Addr {
		t.Fatalf("both leases on %s", la.Addr)
	}
	if la.Addr != "a:1" {
		la, lb1 = lb1, la
	}
	retried := make(chan result, 1)
	depth := s.Snapshot().QueueDepth
	go func() {
		l, err := s.Pick(context.Background(), &lb.Request{Attempt: 1, Avoid: []string{"a:1"}})
		var ql *Lease
		if l != nil {
			ql = l.(*Lease)
		}
		retried <- result{0, ql, err}
	}()
	waitFor(t, "the retry to queue", func() bool { return s.Snapshot().QueueDepth > depth })
	behind := enqueue(t, s, context.Background(), 1)

	la.Release(success(time.Millisecond))
	var rb result
	select {
	case r := <-retried:
		t.Fatalf("the retry was dispatched while only a:1 was free: lease %v, err %v", r.lease, r.err)
	case rb = <-behind:
	}
	if rb.err != nil || rb.lease.Addr != "a:1" {
		t.Fatalf("the request behind the retry: %+v, want a lease on a:1", rb)
	}
	lb1.Release(success(time.Millisecond))
	r := <-retried
	if r.err != nil || r.lease.Addr != "b:1" {
		t.Fatalf("the retry: lease %v, err %v; want a lease on b:1", r.lease, r.err)
	}
	r.lease.Release(success(time.Millisecond))

	// Its only other replica removed while it waits: lb.ErrAllDown.
	hold, hold2 := rb.lease, mustAcquire(t, s) // a:1, b:1
	depth = s.Snapshot().QueueDepth
	go func() {
		_, err := s.Pick(context.Background(), &lb.Request{Attempt: 1, Avoid: []string{"a:1"}})
		retried <- result{err: err}
	}()
	waitFor(t, "the retry to queue", func() bool { return s.Snapshot().QueueDepth > depth })
	s.SetReplicas([]string{"a:1"})
	hold.Release(success(time.Millisecond))
	hold2.Release(success(time.Millisecond))
	if r := <-retried; !errors.Is(r.err, lb.ErrAllDown) {
		t.Fatalf("a retry with no other replica left: %v, want lb.ErrAllDown", r.err)
	}
	if n := s.TotalInFlight(); n != 0 {
		t.Fatalf("in flight at the end = %d", n)
	}
}
