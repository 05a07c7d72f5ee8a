package redisgate

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// instance is one Sluice instance's flow control for the pool, gated
// through Redis.
type instance struct {
	name string
	ctl  *flow.Controller
	gate *Gate
}

// newInstance starts an instance whose pool holds capacity requests
// (max_concurrency 1 × capacity replicas).
func newInstance(t testing.TB, conn redisconn.Config, pool, name string, capacity int, tune func(*Config)) *instance {
	t.Helper()
	cfg := Config{Conn: conn, Pool: pool, Instance: name}
	if tune != nil {
		tune(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fc := flow.Config{Detector: flow.DetectorConfig{Type: flow.DetectorConcurrency, MaxConcurrency: 1}}
	g.SetLocal(flow.NewConcurrencyDetector(fc.Detector, func() int { return capacity }))
	ctl, err := flow.New(fc, g, flow.PublishDemand(g.Feed()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Close(); g.Close() })
	return &instance{name: name, ctl: ctl, gate: g}
}

// uniquePool keeps tests (and their runs over targets) apart in Redis.
func uniquePool(t *testing.T) string {
	return strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()) + fmt.Sprint(time.Now().UnixNano()%1e9)
}

// poolHeld is the total Redis records for the pool.
func poolHeld(t *testing.T, cl rueidis.Client, k Keys) int64 {
	t.Helper()
	m, err := cl.Do(context.Background(), cl.B().Hgetall().Key(k.Held).Build()).AsIntMap()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

func eventually(t *testing.T, what string, cond func() bool, show ...func() any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			var state []any
			for _, f := range show {
				state = append(state, f())
			}
			t.Fatalf("not within 10s: %s %+v", what, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestNeverMoreThanCapacityInFlight: three instances flooding one pool of
// 4 never have more than 4 requests in flight between them, serve every
// request, and give everything back when idle.
func TestNeverMoreThanCapacityInFlight(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		// 8 each: an instance's band queue is its part of the pool's 16,
		// never below 8, whatever the instances it has seen so far.
		const capacity, perInstance = 4, 8
		pool := uniquePool(t)
		var ins []*instance
		for i := range 3 {
			ins = append(ins, newInstance(t, tg.Conn, pool, fmt.Sprintf("i%d", i), capacity, nil))
		}
		var inFlight, peak, served atomic.Int64
		var wg sync.WaitGroup
		for _, in := range ins {
			for range perInstance {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tk, err := in.ctl.Enqueue(context.Background(), flow.Request{FlowID: "t"})
					if err != nil {
						t.Errorf("%s: %v", in.name, err)
						return
					}
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(3 * time.Millisecond)
					inFlight.Add(-1)
					served.Add(1)
					tk.Release()
				}()
			}
		}
		wg.Wait()
		if got := served.Load(); got != 3*perInstance {
			t.Fatalf("served %d of %d", got, 3*perInstance)
		}
		if p := peak.Load(); p > capacity {
			t.Fatalf("%d requests in flight at once over all instances; the pool holds %d", p, capacity)
		}
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor("", pool)
		eventually(t, "every instance gives its share back when idle", func() bool { return poolHeld(t, cl, k) == 0 })
		for _, in := range ins {
			if s := in.gate.Stats(); s.Allowed != 0 || s.RedisErrors != 0 {
				t.Errorf("%s idle: %+v", in.name, s)
			}
		}
	})
}

// TestFewerUnitsThanInstancesTakeTurns: with one unit and two backlogged
// instances, neither keeps the unit: they alternate.
func TestFewerUnitsThanInstancesTakeTurns(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		a := newInstance(t, tg.Conn, pool, "a", 1, nil)
		b := newInstance(t, tg.Conn, pool, "b", 1, nil)
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		const each = 8
		// a holds the unit until both have their requests queued.
		blocker, err := a.ctl.Enqueue(context.Background(), flow.Request{})
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range []*instance{a, b} {
			for range each {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tk, err := in.ctl.Enqueue(context.Background(), flow.Request{})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					order = append(order, in.name)
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					tk.Release()
				}()
			}
		}
		eventually(t, "both instances to queue their requests", func() bool {
			return a.ctl.Snapshot().Queued == each && b.ctl.Snapshot().Queued == each
		})
		// and both wants to be in Redis: until b's claim records its want,
		// nothing tells a that b waits (on a loaded machine b's claim came
		// after a had taken 5 in a row).
		cl := redistest.Client(t, tg.Conn)
		eventually(t, "both wants recorded in Redis", func() bool {
			w, err := cl.Do(context.Background(), cl.B().Hgetall().Key(KeysFor(tg.Conn.KeyPrefix, pool).Want).Build()).AsStrMap()
			return err == nil && w["a"] != "" && w["b"] != ""
		})
		blocker.Release()
		wg.Wait()
		// While both have requests waiting, the longest run of one
		// instance is 2 at most (a turn can straddle a claim).
		run, longest, aLeft, bLeft := 0, 0, each, each
		for i, n := range order {
			if n == "a" {
				aLeft--
			} else {
				bLeft--
			}
			if i > 0 && order[i-1] == n {
				run++
			} else {
				run = 1
			}
			if aLeft > 0 && bLeft > 0 {
				longest = max(longest, run)
			}
		}
		if longest > 2 {
			t.Fatalf("one instance kept the only unit for %d requests in a row while the other waited: %v", longest, order)
		}
	})
}

// TestEntitlementIsMaxMinFair checks the claim script's shares directly:
// small wants are met in full, the rest split the remainder, and units
// left by rounding go to the instance granted least recently.
func TestEntitlementIsMaxMinFair(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor("", uniquePool(t))
		ctx := context.Background()
		do := func(inst string, floor, want, capacity int64) claimed {
			t.Helper()
			// One flow at every instance: shares are max-min over instances.
			r, err := claim(ctx, cl, k, inst, floor, want, fmt.Sprintf("0\tf\t%d\n", want), capacity, time.Minute, seen{})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		// Capacity 10: a wants 2, b and c want 10.
		do("a", 0, 2, 10)
		do("b", 0, 10, 10)
		do("c", 0, 10, 10)
		for inst, want := range map[string]int64{"a": 2, "b": 4, "c": 4} {
			if r := do(inst, 0, map[string]int64{"a": 2, "b": 10, "c": 10}[inst], 10); r.entitled != want {
				t.Errorf("%s entitled to %d, want %d", inst, r.entitled, want)
			}
		}
		// b took the 8 units free when it came, came down to its share
		// at its next claim, and c got what b gave back: the pool is
		// full and no one holds more than its share.
		if r := do("c", 0, 10, 10); r.total > 10 || r.held != 4 {
			t.Errorf("c: %+v", r)
		}
		// A holding in use is never taken away: a's floor of 5 stands
		// beyond its share, and nothing beyond the capacity is granted.
		if r := do("a", 5, 5, 10); r.held != 5 {
			t.Errorf("a with floor 5 holds %d", r.held)
		}
		if r := do("b", 0, 10, 10); r.held > 4 || r.total > 13 {
			t.Errorf("b after a's floor: %+v", r)
		}
		// Idle instances leave: the records go.
		for _, inst := range []string{"a", "b", "c"} {
			do(inst, 0, 0, 10)
		}
		if n := poolHeld(t, cl, k); n != 0 {
			t.Fatalf("idle pool holds %d", n)
		}
		live, err := cl.Do(ctx, cl.B().Zcard().Key(k.Live).Build()).AsInt64()
		if err != nil || live != 0 {
			t.Fatalf("live instances after all left: %d (%v)", live, err)
		}
	})
}

// TestCrashedInstanceShareIsReclaimed: an instance that holds the whole
// pool and stops renewing loses it within its lease.
func TestCrashedInstanceShareIsReclaimed(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor("", pool)
		// The ghost took both units, then died (no more claims).
		if r, err := claim(context.Background(), cl, k, "ghost", 2, 2, "0\tf\t2\n", 2, time.Second, seen{}); err != nil || r.held != 2 {
			t.Fatalf("ghost: %+v %v", r, err)
		}
		b := newInstance(t, tg.Conn, pool, "b", 2, nil)
		var got atomic.Int64
		for range 2 {
			go func() {
				if tk, err := b.ctl.Enqueue(context.Background(), flow.Request{}); err == nil {
					got.Add(1)
					defer tk.Release()
					time.Sleep(100 * time.Millisecond)
				}
			}()
		}
		eventually(t, "the survivor runs 2 at once after the ghost's lease", func() bool {
			return b.gate.Stats().Allowed == 2 && got.Load() == 2
		})
	})
}

// TestRedisAwayFallsBackToAShare: with Redis gone each instance
// dispatches against 1/N of the pool (N seen at the last answer), says
// so, and rejoins the global count when Redis is back.
func TestRedisAwayFallsBackToAShare(t *testing.T) {
	srv := redistest.Private(t)
	conn := redisconn.Config{Addrs: []string{srv.Addr}}
	pool := uniquePool(t)
	var events sync.Map
	tune := func(name string) func(*Config) {
		return func(c *Config) {
			c.OnFallback = func(err error) { events.Store(fmt.Sprintf("%s:%v", name, err == nil), true) }
		}
	}
	a := newInstance(t, conn, pool, "a", 4, tune("a"))
	b := newInstance(t, conn, pool, "b", 4, tune("b"))
	// Both busy, so both count as live instances.
	hold := func(in *instance, n int) func() {
		var tks []*flow.Ticket
		var mu sync.Mutex
		for range n {
			go func() {
				if tk, err := in.ctl.Enqueue(context.Background(), flow.Request{}); err == nil {
					mu.Lock()
					tks = append(tks, tk)
					mu.Unlock()
				}
			}()
		}
		return func() {
			mu.Lock()
			defer mu.Unlock()
			for _, tk := range tks {
				tk.Release()
			}
		}
	}
	releaseA, releaseB := hold(a, 2), hold(b, 2)
	eventually(t, "each holds 2 of 4", func() bool {
		// (each learns of the other at its next claim: a lease renewal at most)
		return a.gate.Stats().Allowed == 2 && b.gate.Stats().Allowed == 2 &&
			a.gate.Stats().Instances == 2 && b.gate.Stats().Instances == 2
	}, func() any { return a.gate.Stats() }, func() any { return b.gate.Stats() })
	// Each queues its part of the pool's band queue: the default 4 × 4
	// requests, over 2 instances.
	if lim := a.ctl.Snapshot().Bands[0].MaxRequests; lim != 8 {
		t.Errorf("a's band queue holds %d requests, want 8 (16 for the pool over 2 instances)", lim)
	}
	srv.Kill()
	eventually(t, "both fall back to half the pool", func() bool {
		sa, sb := a.gate.Stats(), b.gate.Stats()
		return sa.Fallback && sb.Fallback && sa.Allowed == 2 && sb.Allowed == 2
	}, func() any { return a.gate.Stats() }, func() any { return b.gate.Stats() })
	// The gate reports the fallback just after its stats show it.
	eventually(t, "a to report the fallback", func() bool {
		_, ok := events.Load("a:false")
		return ok
	})
	restarted, err := redistest.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Kill)
	eventually(t, "both back on the global count", func() bool {
		sa, sb := a.gate.Stats(), b.gate.Stats()
		return !sa.Fallback && !sb.Fallback && sa.PoolHeld <= 4 && sb.PoolHeld <= 4 && sa.Allowed+sb.Allowed <= 4
	})
	eventually(t, "b to report Redis back", func() bool {
		_, ok := events.Load("b:true")
		return ok
	})
	releaseA()
	releaseB()
	cl := redistest.Client(t, conn)
	eventually(t, "idle again, nothing held", func() bool { return poolHeld(t, cl, KeysFor("", pool)) == 0 })
}

// TestCloseStopsTheClaimer: no goroutine outlives a closed gate, even
// one that never reached Redis.
func TestCloseStopsTheClaimer(t *testing.T) {
	before := runtime.NumGoroutine()
	g, err := New(Config{Conn: redisconn.Config{Addrs: []string{"127.0.0.1:1"}, DialTimeout: 50 * time.Millisecond}, Pool: "p"})
	if err != nil {
		t.Fatal(err)
	}
	g.SetLocal(flow.NewConcurrencyDetector(flow.DetectorConfig{MaxConcurrency: 1}, func() int { return 2 }))
	eventually(t, "unreachable Redis gives the fallback share", func() bool { s := g.Stats(); return s.Fallback && s.Allowed == 2 })
	g.Close()
	eventually(t, "goroutines back to where they were", func() bool { return runtime.NumGoroutine() <= before })
}

// TestValidate names the setting at fault.
func TestValidate(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{"127.0.0.1:6379"}}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Conn: conn, FallbackShare: 1.5}, "fallback_share"},
		{Config{Conn: conn, LeaseTTL: 100 * time.Millisecond}, "lease_ttl"},
		{Config{Conn: redisconn.Config{}}, "redis"},
	} {
		_, err := New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %s", c.cfg, err, c.want)
		}
	}
}

// TestShareBeyondEntitlementIsGivenBackAsRequestsEnd: an instance that
// holds more than its share (it was alone when it took it) gives the
// excess back as each of its requests ends, even with nothing queued, so
// the other instance gets it then — not at the next lease renewal.
func TestShareBeyondEntitlementIsGivenBackAsRequestsEnd(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{redistest.Addr(t)}}
	pool := uniquePool(t)
	quickRenewal := func(c *Config) { c.LeaseTTL = time.Second }
	a := newInstance(t, conn, pool, "a", 2, quickRenewal)
	var tks []*flow.Ticket
	for range 2 {
		tk, err := a.ctl.Enqueue(context.Background(), flow.Request{})
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	b := newInstance(t, conn, pool, "b", 2, nil)
	got := make(chan *flow.Ticket, 2)
	for range 2 {
		go func() {
			if tk, err := b.ctl.Enqueue(context.Background(), flow.Request{}); err == nil {
				got <- tk
			}
		}()
	}
	// a learns its share at its next renewal: 1 of 2, with 2 in flight.
	eventually(t, "a's share lowered to 1 while b waits", func() bool { return a.gate.Stats().Allowed == 1 },
		func() any { return a.gate.Stats() })
	// From now on a renews only every 20 s: what it gives back comes from
	// its requests ending (a claim at each end).
	if err := a.gate.Configure(Config{LeaseTTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the claim Configure triggers
	deadline := time.After(5 * time.Second)
	for _, tk := range tks {
		tk.Release()
		select {
		case tk := <-got:
			defer tk.Release()
		case <-deadline:
			t.Fatalf("b did not get the unit a gave back: a %+v, b %+v", a.gate.Stats(), b.gate.Stats())
		}
	}
}

// TestConfigureAppliesLiveSettings: a reload's lease, fallback share and
// read timeout reach the running gate; its connection and identity stay.
func TestConfigureAppliesLiveSettings(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{redistest.Addr(t)}, KeyPrefix: "p"}
	g, err := New(Config{Conn: conn, Pool: "live", Instance: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	next := Config{Conn: redisconn.Config{Addrs: []string{"10.9.9.9:1"}, ReadTimeout: time.Second},
		LeaseTTL: 9 * time.Second, FallbackShare: 0.5, Instance: "y"}
	if err := g.Configure(next); err != nil {
		t.Fatal(err)
	}
	got := g.Config()
	if got.LeaseTTL != 9*time.Second || got.FallbackShare != 0.5 || got.Conn.ReadTimeout != time.Second {
		t.Errorf("live settings not applied: %+v", got)
	}
	if got.Conn.Addrs[0] != conn.Addrs[0] || got.Conn.KeyPrefix != "p" || got.Instance != "x" || got.Pool != "live" {
		t.Errorf("connection or identity changed live: %+v", got)
	}
	if err := g.Configure(Config{FallbackShare: 3}); err == nil || !strings.Contains(err.Error(), "fallback_share") {
		t.Errorf("bad share accepted: %v", err)
	}
	if g.Config().FallbackShare != 0.5 {
		t.Errorf("a refused Configure changed the settings: %+v", g.Config())
	}
}

// TestSharesFollowTenantsAndPriorityAcrossInstances: the capacity is
// shared as one flow control would share it — by priority band, then
// max-min over tenants wherever they wait — not equally by instance.
func TestSharesFollowTenantsAndPriorityAcrossInstances(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		cl := redistest.Client(t, tg.Conn)
		k := KeysFor("", uniquePool(t))
		ctx := context.Background()
		do := func(inst string, demand ...flow.FlowDemand) claimed {
			t.Helper()
			want := int64(0)
			for _, d := range demand {
				want += d.Queued.Requests
			}
			r, err := claim(ctx, cl, k, inst, 0, want, encodeDemand(demand, false), 6, time.Minute, seen{})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		q := func(prio int, tenant string, n int64) flow.FlowDemand {
			return flow.FlowDemand{Priority: prio, FlowID: tenant, Queued: flow.InFlight{Requests: n}}
		}
		// Capacity 6. Tenant B floods a, b and c; quiet tenant A waits at
		// c only. Max-min over tenants: A 1, B 5 (5/3 per instance).
		do("a", q(0, "B", 20))
		do("b", q(0, "B", 20))
		do("c", q(0, "B", 20), q(0, "A", 1))
		ra, rb, rc := do("a", q(0, "B", 20)), do("b", q(0, "B", 20)), do("c", q(0, "B", 20), q(0, "A", 1))
		if ra.entitled+rb.entitled+rc.entitled != 6 || rc.entitled < 2 || ra.entitled > 2 || rb.entitled > 2 {
			t.Fatalf("entitlements a %d, b %d, c %d: want 6 in all and c (with tenant A) at least 2", ra.entitled, rb.entitled, rc.entitled)
		}
		// A premium request at a: the premium band is served first, so a
		// is entitled to it on top of its share of the rest.
		before := do("a", q(0, "B", 20)).entitled
		if r := do("a", q(0, "B", 20), q(10, "P", 1)); r.entitled < 2 || r.entitled <= before-1 {
			t.Fatalf("a with a premium request entitled to %d (before %d)", r.entitled, before)
		}
		// Flows are named by a hash: no client byte reaches Redis.
		d := encodeDemand([]flow.FlowDemand{q(0, "evil\t\ntenant", 1)}, false)
		if strings.Count(d, "\n") != 1 || strings.Count(d, "\t") != 2 || strings.Contains(d, "evil") {
			t.Fatalf("encoding leaks the flow id: %q", d)
		}
	})
}

// TestDemandLinesAreBounded: an instance with thousands of tenants writes
// at most maxDemandLines lines, the rest summed per band.
func TestDemandLinesAreBounded(t *testing.T) {
	var flows []flow.FlowDemand
	for i := range 5000 {
		flows = append(flows, flow.FlowDemand{FlowID: fmt.Sprint("t", i), Queued: flow.InFlight{Requests: 1}})
	}
	d := encodeDemand(flows, false)
	if n := strings.Count(d, "\n"); n != maxDemandLines {
		t.Fatalf("%d lines", n)
	}
	if !strings.Contains(d, "0\t~\t4937\n") {
		t.Fatalf("the rest is not one line of 4937 units: ...%s", d[len(d)-40:])
	}
}

// TestFreedUnitGoesWhereTheSharesSay: while an instance waits for its
// share, an instance holding exactly its own gives back the next unit
// that frees up instead of reusing it for its queue — as one flow control
// would hand the freed unit to the quiet tenant's request.
func TestFreedUnitGoesWhereTheSharesSay(t *testing.T) {
	conn := redisconn.Config{Addrs: []string{redistest.Addr(t)}}
	pool := uniquePool(t)
	enqueue := func(in *instance, tenant string) <-chan *flow.Ticket {
		ch := make(chan *flow.Ticket, 1)
		go func() {
			if tk, err := in.ctl.Enqueue(context.Background(), flow.Request{FlowID: tenant}); err == nil {
				ch <- tk
			}
		}()
		return ch
	}
	take := func(ch <-chan *flow.Ticket, what string) *flow.Ticket {
		t.Helper()
		select {
		case tk := <-ch:
			return tk
		case <-time.After(5 * time.Second):
			t.Fatalf("no ticket within 5s: %s", what)
			return nil
		}
	}
	// y, then x, each run one request of the flood (B) and queue three
	// more. B's share is the one unit A does not get; which of x and y is
	// entitled to it is rounding's turn-taking (an instance that yields
	// goes to the back of the line), so either may be.
	y := newInstance(t, conn, pool, "y", 2, nil)
	ty := take(enqueue(y, "B"), "y's first B")
	x := newInstance(t, conn, pool, "x", 2, nil)
	tx := take(enqueue(x, "B"), "x's first B")
	defer tx.Release()
	var more []<-chan *flow.Ticket
	for range 3 {
		more = append(more, enqueue(y, "B"), enqueue(x, "B"))
	}
	// The quiet tenant A arrives at z: A's share is 1 of the 2 units.
	z := newInstance(t, conn, pool, "z", 2, nil)
	gotA := enqueue(z, "A")
	eventually(t, "y to stop reusing its unit while z waits for A's share", func() bool {
		s, sz := y.gate.Stats(), z.gate.Stats()
		return s.Held == 1 && s.Allowed == 0 && sz.Entitled == 1 && sz.Held == 0
	}, func() any { return y.gate.Stats() }, func() any { return z.gate.Stats() })
	ty.Release() // y's request ends first: its unit goes to z's A, not to y's queue
	defer take(gotA, "A at z after y's request ended").Release()
	if n := y.ctl.Snapshot().Counters.Dispatched; n != 1 {
		t.Fatalf("y dispatched %d requests; its freed unit should have gone to z", n)
	}
	_ = more
}

// Every command the claim script calls is one the access check runs.
func TestAccessScriptCoversTheClaimScript(t *testing.T) {
	call, step := regexp.MustCompile(`redis\.call\('([A-Z]+)'`), regexp.MustCompile(`\{'([A-Z]+)'`)
	access, err := os.ReadFile("access.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]bool{}
	for _, m := range step.FindAllStringSubmatch(string(access), -1) {
		checked[m[1]] = true
	}
	claim, err := os.ReadFile("claim.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range call.FindAllStringSubmatch(string(claim), -1) {
		if !checked[m[1]] {
			t.Errorf("the claim script calls %s, which the access check does not run", m[1])
		}
	}
}
