// Package lbtest is the conformance suite every load-balancing policy's
// lb.Picker runs, as the Gateway API Inference Extension runs one against
// every flow-control plugin. It checks what the Caddy adapter relies on,
// whatever the policy: an empty pool refuses at once; only present
// replicas are picked; every lease releases exactly once and InFlight
// counts exactly the leases not yet released (retries, cancellation,
// removal, a reload and churn included); req.Unavailable is never picked,
// nor req.Avoid for the retry that lists it;
// concurrent SetReplicas calls leave a consistent picker; a pick while
// the whole set is swapped finds a replica of one set or the other; a
// changed setting is applied in place; every pick says why
// (lb.Request.Reason).
//
// Every Pick runs under a context that ends after a few seconds, so a
// picker that blocks forever fails instead of hanging the test; a
// queueing picker's ctx errors count as refusals, never as leaks.
//
// Pickers with passive health should be built with a short down time
// (e.g. a millisecond): the churn test fails some attempts, and a queueing
// picker whose replicas are all down holds its requests until they
// recover.
package lbtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// Subject is the policy under test.
type Subject struct {
	// New returns a fresh picker with no replicas; register its cleanup
	// with t.Cleanup.
	New func(t *testing.T) lb.Picker
	// Reconfigure applies a changed setting to p in place, as a config
	// reload does; Applied reports whether p now runs with it. Both nil:
	// the setting check is skipped.
	Reconfigure func(t *testing.T, p lb.Picker)
	Applied     func(p lb.Picker) bool
}

// guard bounds every Pick: a broken picker fails the test, never hangs
// it. It is a liveness bound, not a timing assertion.
const guard = 5 * time.Second

// addrs returns n replica addresses of one family (distinct families
// never share an address).
func addrs(family, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.%d.%d:8000", family, i+1)
	}
	return out
}

// Run runs the suite, one subtest per property, each on a fresh picker.
func Run(t *testing.T, s Subject) {
	t.Helper()
	if s.New == nil {
		t.Fatal("lbtest: Subject.New is nil")
	}
	if (s.Reconfigure == nil) != (s.Applied == nil) {
		t.Fatal("lbtest: set both Subject.Reconfigure and Subject.Applied, or neither")
	}
	tests := []struct {
		name string
		fn   func(*testing.T, Subject)
	}{
		{"EmptyPoolRefusesAtOnce", testEmptyPool},
		{"PicksSpreadOverPresentReplicas", testSpread},
		{"ReleaseCountsExactlyOnce", testReleaseOnce},
		{"RetryWithTheSameRequest", testRetry},
		{"CancelledContextLeaksNothing", testCancelled},
		{"RemovedReplicaIsNeverPickedAndStillReleases", testRemoved},
		{"UnavailableReplicasAreNeverPicked", testUnavailable},
		{"RetryAvoidsTheReplicasThatFailedIt", testAvoid},
		{"ConcurrentSetReplicasLeaveOneSet", testConcurrentSet},
		{"PicksDuringASetSwapFindAReplica", testSetSwap},
		{"ReloadKeepsLeasesAndAppliesTheSetting", testReload},
		{"ChurnEndsAtZero", testChurn},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, s) })
	}
}

// request returns the i-th test request: a parsed prompt whose first two
// characters differ from those of every other i below 676, so that a
// prefix-caching policy sees unrelated prompts.
func request(i int) *lb.Request {
	return &lb.Request{
		Model:  "lbtest",
		Text:   fmt.Sprintf("%c%c: lbtest prompt number %d", 'a'+i%26, 'A'+(i/26)%26, i),
		Parsed: true,
		Tokens: 32,
	}
}

func success() lb.Outcome {
	return lb.Outcome{Kind: lb.Success, Latency: time.Millisecond, Status: 200}
}

var cancelled = lb.Outcome{Kind: lb.Cancelled}

// pick is one guarded Pick. It reports a picker that returns both a
// lease and an error, or neither.
func pick(p lb.Picker, req *lb.Request) (lb.Lease, error) {
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	return checked(p.Pick(ctx, req))
}

func checked(l lb.Lease, err error) (lb.Lease, error) {
	switch {
	case err != nil && l != nil:
		l.Release(cancelled)
		return nil, fmt.Errorf("Pick returned a lease on %s together with the error %w", l.Replica(), err)
	case err == nil && l == nil:
		return nil, errors.New("Pick returned neither a lease nor an error")
	}
	return l, err
}

// mustPick picks for req and fails the test unless a lease on one of
// among comes back.
func mustPick(t *testing.T, p lb.Picker, req *lb.Request, among []string) lb.Lease {
	t.Helper()
	req.Reason = "" // a retry must say why again, not keep the first answer
	l, err := pick(p, req)
	if err != nil {
		t.Fatalf("Pick (attempt %d, unavailable %v): %v", req.Attempt, req.Unavailable, err)
	}
	if !slices.Contains(among, l.Replica()) {
		t.Fatalf("Pick chose %q, want one of %v", l.Replica(), among)
	}
	if req.Reason == "" {
		t.Fatalf("Pick chose %q without saying why (lb.Request.Reason is empty)", l.Replica())
	}
	return l
}

// mustRelease releases l with o and fails unless that first Release
// reports it counted.
func mustRelease(t *testing.T, l lb.Lease, o lb.Outcome) {
	t.Helper()
	if !l.Release(o) {
		t.Fatalf("first Release of a lease on %s returned false", l.Replica())
	}
}

// wantInFlight fails unless p.InFlight() counts exactly the leases in
// held, per replica (replicas at zero may be listed or left out).
func wantInFlight(t *testing.T, p lb.Picker, held []lb.Lease) {
	t.Helper()
	want := map[string]int{}
	for _, l := range held {
		want[l.Replica()]++
	}
	got := map[string]int{}
	for a, n := range p.InFlight() {
		if n < 0 {
			t.Fatalf("InFlight()[%s] = %d, negative", a, n)
		}
		if n != 0 {
			got[a] = n
		}
	}
	if !mapsEqual(got, want) {
		t.Fatalf("InFlight() = %v, want %v (the leases not yet released)", got, want)
	}
}

func zero(t *testing.T, p lb.Picker) {
	t.Helper()
	wantInFlight(t, p, nil)
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func without(set []string, drop ...string) []string {
	var out []string
	for _, a := range set {
		if !slices.Contains(drop, a) {
			out = append(out, a)
		}
	}
	return out
}

func distinct(leases []lb.Lease) []string {
	var out []string
	for _, l := range leases {
		if !slices.Contains(out, l.Replica()) {
			out = append(out, l.Replica())
		}
	}
	sort.Strings(out)
	return out
}

func releaseAll(t *testing.T, leases []lb.Lease) {
	t.Helper()
	for _, l := range leases {
		mustRelease(t, l, success())
	}
}

func testEmptyPool(t *testing.T, s Subject) {
	p := s.New(t)
	refuse := func(when string) {
		t.Helper()
		l, err := pick(p, request(0))
		if err == nil {
			l.Release(cancelled)
		}
		if !errors.Is(err, lb.ErrNoBackends) {
			t.Fatalf("%s: Pick = %v, want lb.ErrNoBackends at once", when, err)
		}
	}
	refuse("new picker")
	zero(t, p)

	set := addrs(0, 2)
	p.SetReplicas(set)
	mustRelease(t, mustPick(t, p, request(1), set), success())
	p.SetReplicas(nil)
	refuse("after SetReplicas(nil)")
	p.SetReplicas(set)
	mustRelease(t, mustPick(t, p, request(2), set), success())
	p.SetReplicas([]string{})
	refuse("after SetReplicas([]string{})")
	zero(t, p)
}

func testSpread(t *testing.T, s Subject) {
	p := s.New(t)
	set := addrs(0, 3)
	p.SetReplicas(set)
	// As many leases held as replicas, for unrelated prompts: a policy
	// that weighs load does not stack them all on one replica.
	var held []lb.Lease
	for i := range set {
		held = append(held, mustPick(t, p, request(i), set))
		wantInFlight(t, p, held)
	}
	if d := distinct(held); len(d) < 2 {
		t.Errorf("%d leases held at once, all on %v: picks do not spread", len(held), d)
	}
	releaseAll(t, held)
	zero(t, p)

	// One at a time: every pick is a present replica.
	for i := 0; i < 30; i++ {
		l := mustPick(t, p, request(10+i), set)
		wantInFlight(t, p, []lb.Lease{l})
		mustRelease(t, l, success())
	}
	zero(t, p)

	// A new set, overlapping the old one in one replica: only it is used.
	next := append(addrs(1, 2), set[2])
	p.SetReplicas(next)
	held = held[:0]
	for i := range next {
		held = append(held, mustPick(t, p, request(50+i), next))
	}
	wantInFlight(t, p, held)
	releaseAll(t, held)
	for i := 0; i < 10; i++ {
		mustRelease(t, mustPick(t, p, request(60+i), next), success())
	}
	zero(t, p)
}

func testReleaseOnce(t *testing.T, s Subject) {
	p := s.New(t)
	set := addrs(0, 2)
	p.SetReplicas(set)
	l := mustPick(t, p, request(0), set)
	wantInFlight(t, p, []lb.Lease{l})
	mustRelease(t, l, success())
	if l.Release(success()) {
		t.Fatal("second Release returned true")
	}
	if l.Release(lb.Outcome{Kind: lb.Failure, Status: 502}) {
		t.Fatal("a Release after the first returned true")
	}
	zero(t, p)

	// Racing releases: exactly one counts.
	l = mustPick(t, p, request(1), set)
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			o := success()
			if g%2 == 1 {
				o = cancelled
			}
			if l.Release(o) {
				mu.Lock()
				won++
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	if won != 1 {
		t.Fatalf("%d of 8 racing Releases returned true, want exactly 1", won)
	}
	zero(t, p)
}

func testRetry(t *testing.T, s Subject) {
	p := s.New(t)
	set := addrs(0, 3)
	p.SetReplicas(set)
	// A request whose attempts fail twice, then succeed: with three
	// replicas a third one is always left, whatever passive health did.
	req := request(0)
	first := mustPick(t, p, req, set)
	wantInFlight(t, p, []lb.Lease{first})
	mustRelease(t, first, lb.Outcome{Kind: lb.Failure, Status: 502})
	zero(t, p)
	req.Attempt = 1
	second := mustPick(t, p, req, set)
	wantInFlight(t, p, []lb.Lease{second})
	mustRelease(t, second, lb.Outcome{Kind: lb.Failure, Status: 503})
	req.Attempt = 2
	third := mustPick(t, p, req, set)
	wantInFlight(t, p, []lb.Lease{third})
	mustRelease(t, third, success())
	zero(t, p)

	// A retry while another request's lease is outstanding.
	other := mustPick(t, p, request(1), set)
	req = request(2)
	l := mustPick(t, p, req, set)
	mustRelease(t, l, cancelled)
	req.Attempt = 1
	l = mustPick(t, p, req, set)
	wantInFlight(t, p, []lb.Lease{other, l})
	mustRelease(t, l, success())
	mustRelease(t, other, success())
	zero(t, p)
}

func testCancelled(t *testing.T, s Subject) {
	p := s.New(t)
	set := addrs(0, 1)
	p.SetReplicas(set)

	// A context that ended before Pick.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if l, err := checked(p.Pick(ctx, request(0))); err == nil {
		mustRelease(t, l, cancelled)
	} else if errors.Is(err, lb.ErrNoBackends) || errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("cancelled context: %v, the pool was neither empty nor down", err)
	}
	zero(t, p)

	// Contexts cancelled while the only replica is busy: a queueing
	// picker is then (likely) holding the requests in its queue. Each
	// ends with an error or a lease, and a lease handed to a request
	// that already left is not lost.
	busy := mustPick(t, p, request(1), set)
	type result struct {
		l   lb.Lease
		err error
	}
	const waiters = 4
	results := make(chan result, waiters)
	var cancels []context.CancelFunc
	for i := 0; i < waiters; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		go func(i int) {
			l, err := checked(p.Pick(ctx, request(2+i)))
			results <- result{l, err}
		}(i)
	}
	runtime.Gosched()
	for _, cancel := range cancels {
		cancel()
	}
	var held []lb.Lease
	stuck := time.NewTimer(guard)
	defer stuck.Stop()
	for i := 0; i < waiters; i++ {
		select {
		case r := <-results:
			if r.err == nil {
				if !slices.Contains(set, r.l.Replica()) {
					t.Fatalf("Pick chose %q, want one of %v", r.l.Replica(), set)
				}
				held = append(held, r.l)
			}
		case <-stuck.C:
			t.Fatalf("Pick ignored its cancelled context for %s", guard)
		}
	}
	wantInFlight(t, p, append([]lb.Lease{busy}, held...))
	for _, l := range held {
		mustRelease(t, l, cancelled)
	}
	mustRelease(t, busy, success())
	zero(t, p)
	// The cancelled requests took no slot for good: the replica serves.
	mustRelease(t, mustPick(t, p, request(10), set), success())
	zero(t, p)
}

func testRemoved(t *testing.T, s Subject) {
	p := s.New(t)
	set := addrs(0, 3)
	p.SetReplicas(set)

	// Remove the replica a lease is on: it drains, it is not picked.
	old := mustPick(t, p, request(0), set)
	gone := old.Replica()
	rest := without(set, gone)
	p.SetReplicas(rest)
	wantInFlight(t, p, []lb.Lease{old})
	for i := 0; i < 20; i++ {
		mustRelease(t, mustPick(t, p, request(1+i), rest), success())
	}
	var held []lb.Lease
	for i := range rest {
		held = append(held, mustPick(t, p, request(30+i), rest))
	}
	wantInFlight(t, p, append([]lb.Lease{old}, held...))
	mustRelease(t, old, success())
	releaseAll(t, held)
	zero(t, p)

	// Removed and added back while a lease is outstanding: the lease
	// still releases once, and the count ends at zero.
	p.SetReplicas(set)
	l := mustPick(t, p, request(40), set)
	p.SetReplicas(without(set, l.Replica()))
	p.SetReplicas(set)
	wantInFlight(t, p, []lb.Lease{l})
	mustRelease(t, l, success())
	zero(t, p)
	for i := 0; i < 6; i++ {
		mustRelease(t, mustPick(t, p, request(41+i), set), success())
	}

	// Every replica removed while leases are outstanding.
	held = held[:0]
	for i := 0; i < 2; i++ {
		held = append(held, mustPick(t, p, request(50+i), set))
	}
	p.SetReplicas(nil)
	if l, err := pick(p, request(60)); !errors.Is(err, lb.ErrNoBackends) {
		if err == nil {
			l.Release(cancelled)
		}
		t.Fatalf("every replica removed: Pick = %v, want lb.ErrNoBackends", err)
	}
	wantInFlight(t, p, held)
	releaseAll(t, held)
	zero(t, p)
}

func testUnavailable(t *testing.T, s Subject) {
	p := s.New(t)
	set := addrs(0, 3)
	p.SetReplicas(set)
	a := set[0]

	unavailable := func(i int, u ...string) *lb.Request {
		req := request(i)
		req.Unavailable = u
		return req
	}
	neverPicked(t, p, set, unavailable)

	// Every replica unavailable: refused, not queued.
	l, err := pick(p, unavailable(40, set...))
	switch {
	case err == nil:
		l.Release(cancelled)
		t.Fatalf("every replica unavailable: Pick chose %s", l.Replica())
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		t.Logf("every replica unavailable: Pick waited for its deadline (%v); lb.ErrAllDown at once is preferred", err)
	case !errors.Is(err, lb.ErrAllDown):
		t.Fatalf("every replica unavailable: Pick = %v, want lb.ErrAllDown", err)
	}
	zero(t, p)

	// The view is each request's own: without it, a is picked again.
	stillPicked(t, p, set, a)
}

// testAvoid: a retry is not sent back to the replicas that failed it
// (req.Avoid) while another is left; with none left the pick says
// lb.ErrAllDown at once, and the adapter asks again without Avoid (a
// picker that queued the retry instead would hold it for nothing). The
// list is the request's own: other requests still get those replicas.
func testAvoid(t *testing.T, s Subject) {
	p := s.New(t)
	set := addrs(0, 3)
	p.SetReplicas(set)

	retry := func(i int, avoid ...string) *lb.Request {
		req := request(i)
		req.Attempt, req.Avoid = 1, avoid
		return req
	}
	neverPicked(t, p, set, retry)

	// Every replica failed this request: lb.ErrAllDown, not a wait.
	if l, err := pick(p, retry(40, set...)); err == nil {
		l.Release(cancelled)
		t.Fatalf("every replica avoided: Pick chose %s", l.Replica())
	} else if !errors.Is(err, lb.ErrAllDown) {
		t.Fatalf("every replica avoided: Pick = %v, want lb.ErrAllDown", err)
	}
	zero(t, p)

	stillPicked(t, p, set, set[0])
}

// neverPicked checks that requests built by excluding(i, set[0]) never
// get set[0], one after another and held at once (an unknown address in
// the list changing nothing).
func neverPicked(t *testing.T, p lb.Picker, set []string, excluding func(i int, addrs ...string) *lb.Request) {
	t.Helper()
	a := set[0]
	for i := 0; i < 20; i++ {
		mustRelease(t, mustPick(t, p, excluding(i, a), set[1:]), success())
	}
	var held []lb.Lease
	for i := 0; i < 2; i++ {
		held = append(held, mustPick(t, p, excluding(30+i, "192.0.2.1:1", a), set[1:]))
	}
	wantInFlight(t, p, held)
	releaseAll(t, held)
	zero(t, p)
}

// stillPicked checks that requests excluding nothing still get a: one
// request's exclusions say nothing about the next.
func stillPicked(t *testing.T, p lb.Picker, set []string, a string) {
	t.Helper()
	var held []lb.Lease
	for i := range set {
		held = append(held, mustPick(t, p, request(50+i), set))
	}
	if !slices.Contains(distinct(held), a) {
		t.Errorf("%d leases held for requests that exclude nothing, none on %s: %v", len(held), a, distinct(held))
	}
	releaseAll(t, held)
	zero(t, p)
}

func testConcurrentSet(t *testing.T, s Subject) {
	p := s.New(t)
	sets := [][]string{addrs(0, 2), addrs(1, 2)}
	for round := 0; round < 200; round++ {
		var wg sync.WaitGroup
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func(set []string) {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					p.SetReplicas(set)
					if i%4 == 0 {
						runtime.Gosched()
					}
				}
			}(sets[g])
		}
		wg.Wait()
		// One of the two sets won, entirely: picks succeed, and come
		// from that set alone.
		var held []lb.Lease
		for i := 0; i < 2; i++ {
			l, err := pick(p, request(round*2+i))
			if err != nil {
				t.Fatalf("round %d: after concurrent SetReplicas of two non-empty sets, Pick = %v", round, err)
			}
			held = append(held, l)
		}
		d := distinct(held)
		if !(isSubset(d, sets[0]) || isSubset(d, sets[1])) {
			t.Fatalf("round %d: picks %v mix the sets %v and %v", round, d, sets[0], sets[1])
		}
		releaseAll(t, held)
		zero(t, p)
	}
}

// testSetSwap: while another goroutine replaces the whole set back and
// forth (never empty), every pick finds a replica, one of the old set
// (the call has not landed) or of the new one: never a refusal because
// it read one part of the picker under one set and another part under
// the other (a 503 during a rolling update).
func testSetSwap(t *testing.T, s Subject) { SetSwap(t, s.New(t), 5000) }

// SetSwap makes picks picks from p while another goroutine replaces its
// whole set back and forth (see testSetSwap), for a picker's modes the
// conformance subject does not build.
func SetSwap(t *testing.T, p lb.Picker, picks int) {
	t.Helper()
	sets := [][]string{addrs(0, 2), addrs(1, 2)}
	either := append(slices.Clone(sets[0]), sets[1]...)
	p.SetReplicas(sets[0])
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p.SetReplicas(sets[i%2])
		}
	}()
	refused := map[string]int{}
	var strays []string
	for i := 0; i < picks; i++ {
		req := request(i % 50)
		if i%2 == 1 {
			req = &lb.Request{} // a body that was not read: routed by load alone
		}
		l, err := pick(p, req)
		if err != nil {
			refused[err.Error()]++
			if errors.Is(err, context.DeadlineExceeded) {
				break // a pick blocked for the guard: one is enough
			}
			continue
		}
		if !slices.Contains(either, l.Replica()) && len(strays) < 5 {
			strays = append(strays, l.Replica())
		}
		if !l.Release(success()) {
			t.Errorf("first Release of a lease on %s returned false", l.Replica())
		}
	}
	close(stop)
	<-done
	if len(refused) > 0 {
		n := 0
		for _, c := range refused {
			n += c
		}
		t.Errorf("%d of %d picks refused while the whole set was swapped (never empty), by error: %v", n, picks, refused)
	}
	if len(strays) > 0 {
		t.Errorf("picks chose %v, in neither %v nor %v", strays, sets[0], sets[1])
	}
	zero(t, p)
}

func isSubset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func testReload(t *testing.T, s Subject) {
	if s.Reconfigure == nil {
		t.Skip("the subject has no setting to change")
	}
	p := s.New(t)
	if s.Applied(p) {
		t.Fatal("Applied is true before Reconfigure: it does not tell the setting apart")
	}
	set := addrs(0, 2)
	p.SetReplicas(set)
	// As many leases as replicas, no more: a queueing picker may hold a
	// request beyond its capacity.
	held := []lb.Lease{mustPick(t, p, request(0), set)}
	s.Reconfigure(t, p)
	if !s.Applied(p) {
		t.Fatal("the new setting is not in force after Reconfigure")
	}
	wantInFlight(t, p, held)
	// A lease from before the reload and one from after, released after.
	held = append(held, mustPick(t, p, request(1), set))
	wantInFlight(t, p, held)
	releaseAll(t, held)
	zero(t, p)
	for i := 0; i < 4; i++ {
		mustRelease(t, mustPick(t, p, request(3+i), set), success())
	}
	zero(t, p)
	if !s.Applied(p) {
		t.Fatal("the new setting did not stay in force")
	}
}

// refusal reports whether err is one a picker may give under churn:
// one of lb's refusals or the guard's context error.
func refusal(err error) bool {
	for _, e := range []error{lb.ErrNoBackends, lb.ErrAllDown, lb.ErrQueueFull, lb.ErrEvicted,
		lb.ErrQueueTimeout, lb.ErrSaturated, context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func testChurn(t *testing.T, s Subject) {
	p := s.New(t)
	universe := addrs(0, 5)
	p.SetReplicas(universe)

	stop := make(chan struct{})
	setterDone := make(chan struct{})
	var setterErr error
	go func() {
		defer close(setterDone)
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			var set []string
			if rng.IntN(10) != 0 { // now and then, an empty pool
				for _, a := range universe {
					if rng.IntN(2) == 0 {
						set = append(set, a)
					}
				}
			}
			p.SetReplicas(set)
			for a, n := range p.InFlight() {
				if n < 0 && setterErr == nil {
					setterErr = fmt.Errorf("InFlight()[%s] = %d during churn", a, n)
				}
			}
			runtime.Gosched()
		}
	}()

	const goroutines, picks = 8, 150
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	served := 0
	report := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			// Like a proxied request, a goroutine holds one lease at a
			// time: a queueing picker may block while its own holder
			// waits, which is no fault of the picker.
			for i := 0; i < picks; i++ {
				req := request(g*picks + i)
				if rng.IntN(8) == 0 {
					req.Unavailable = []string{universe[rng.IntN(len(universe))]}
				}
				for ; req.Attempt < 3; req.Attempt++ {
					ctx, cancel := context.WithTimeout(context.Background(), guard)
					if rng.IntN(20) == 0 {
						cancel() // a client that left before the pick
					}
					l, err := checked(p.Pick(ctx, req))
					cancel()
					if err != nil {
						if !refusal(err) {
							report(fmt.Errorf("Pick under churn: unexpected error %w", err))
						}
						break
					}
					if !slices.Contains(universe, l.Replica()) {
						report(fmt.Errorf("Pick chose %q, never a replica", l.Replica()))
					}
					mu.Lock()
					served++
					mu.Unlock()
					for k := rng.IntN(4); k > 0; k-- {
						runtime.Gosched() // the attempt runs while sets change
					}
					var o lb.Outcome
					switch r := rng.IntN(10); {
					case r < 7:
						o = lb.Outcome{Kind: lb.Success, Latency: time.Duration(1+rng.IntN(50)) * time.Millisecond, Status: 200}
					case r < 8:
						o = lb.Outcome{Kind: lb.Failure, Status: 502}
					default:
						o = cancelled
					}
					if !l.Release(o) {
						report(fmt.Errorf("first Release of a lease on %s returned false", l.Replica()))
					}
					if l.Release(o) {
						report(fmt.Errorf("second Release of a lease on %s returned true", l.Replica()))
					}
					if o.Kind != lb.Failure {
						break
					}
					// A failure: the same request is retried.
				}
			}
		}(g)
	}
	wg.Wait()
	close(stop)
	<-setterDone
	if setterErr != nil {
		t.Error(setterErr)
	}
	for i, err := range errs {
		if i == 10 {
			t.Errorf("... and %d more", len(errs)-i)
			break
		}
		t.Error(err)
	}
	if served == 0 {
		t.Error("no Pick succeeded during churn")
	}
	zero(t, p)

	// The picker still works: a fresh set, never failed, serves at once.
	fresh := addrs(9, 2)
	p.SetReplicas(fresh)
	var held []lb.Lease
	for i := range fresh {
		held = append(held, mustPick(t, p, request(5000+i), fresh))
	}
	releaseAll(t, held)
	zero(t, p)
}
