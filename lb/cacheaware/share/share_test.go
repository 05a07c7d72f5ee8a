package share

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
	"github.com/sluice-router/sluice/lb/tracker"
)

func TestMain(m *testing.M) { redistest.Main(m) }

var replicas = []string{"r1:1", "r2:1", "r3:1", "r4:1"}

// instance is one Sluice instance's cache_aware picker sharing its tree.
type instance struct {
	p *cacheaware.Picker
	s *Sharer
}

func newInstance(t *testing.T, conn redisconn.Config, pool string) *instance {
	t.Helper()
	p := cacheaware.NewPicker(cacheaware.Config{}, tracker.Config{})
	p.SetReplicas(replicas)
	s := New(Config{Conn: conn, Pool: pool}, p.PeerRouted)
	p.OnInsert(s.Publish)
	t.Cleanup(s.Close)
	return &instance{p, s}
}

// route sends one request through the instance and releases it.
func (in *instance) route(t *testing.T, text string) (string, cacheaware.Reason) {
	t.Helper()
	req := &lb.Request{Model: "m", Text: text, Parsed: true}
	l, d, err := in.p.PickDecision(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	l.Release(lb.Outcome{})
	return d.Addr, d.Reason
}

// peek is where the instance's tree would send text (no insert).
func (in *instance) peek(text string) cacheaware.Decision {
	return in.p.Router().Pick("m", text, func(string) (int, bool) { return 0, true })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func uniquePool(t *testing.T) string {
	return strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + fmt.Sprint(time.Now().UnixNano())
}

func prefix(i int) string {
	return fmt.Sprintf("system prompt %d: %s", i, strings.Repeat(fmt.Sprintf("rule %d. ", i), 40))
}

// A prefix learned through one instance routes to the same replica
// through the other, and an instance never applies its own entries.
func TestConverge(t *testing.T) {
	for _, tg := range redistest.Targets(t) {
		t.Run(tg.Name, func(t *testing.T) {
			pool := uniquePool(t)
			a, b := newInstance(t, tg.Conn, pool), newInstance(t, tg.Conn, pool)
			want := map[int]string{}
			for i := range 8 {
				addr, _ := a.route(t, prefix(i)+" question one")
				want[i] = addr
			}
			waitFor(t, "b applies a's 8 inserts", func() bool { return b.s.Stats().Applied == 8 })
			for i := range 8 {
				addr, reason := b.route(t, prefix(i)+" question two")
				if addr != want[i] || reason != cacheaware.CacheHit {
					t.Errorf("prefix %d via b: %s (%v), via a: %s", i, addr, reason, want[i])
				}
			}
			waitFor(t, "a applies b's 8 inserts", func() bool { return a.s.Stats().Applied == 8 })
			waitFor(t, "both published 8", func() bool {
				return a.s.Stats().Published == 8 && b.s.Stats().Published == 8
			})
			// Each read the stream's 16 entries and applied only the other's 8.
			if sa, sb := a.s.Stats(), b.s.Stats(); sa.Applied != 8 || sb.Applied != 8 {
				t.Errorf("applied a=%d b=%d, want 8 each (own entries skipped)", sa.Applied, sb.Applied)
			}
		})
	}
}

// An instance started later replays the stream's retained history.
func TestLateJoinerCatchesUp(t *testing.T) {
	for _, tg := range redistest.Targets(t) {
		t.Run(tg.Name, func(t *testing.T) {
			pool := uniquePool(t)
			a := newInstance(t, tg.Conn, pool)
			want := map[int]string{}
			for i := range 6 {
				want[i], _ = a.route(t, prefix(i))
			}
			waitFor(t, "a published", func() bool { return a.s.Stats().Published == 6 })
			c := newInstance(t, tg.Conn, pool)
			waitFor(t, "c caught up", func() bool { return c.s.Stats().Applied == 6 })
			for i := range 6 {
				if d := c.peek(prefix(i) + " more"); d.Addr != want[i] || d.Reason != cacheaware.CacheHit {
					t.Errorf("prefix %d on the late joiner: %+v, want %s", i, d, want[i])
				}
			}
		})
	}
}

// Redis away (a private single server, killed and restarted): both
// instances keep routing with their local trees; when it returns, what
// was learned meanwhile reaches the other instance.
func TestRedisAwayThenBack(t *testing.T) {
	srv := redistest.Private(t)
	conn := redisconn.Config{Addrs: []string{srv.Addr}}
	pool := uniquePool(t)
	a, b := newInstance(t, conn, pool), newInstance(t, conn, pool)
	first, _ := a.route(t, prefix(0))
	waitFor(t, "b applied the first", func() bool { return b.s.Stats().Applied == 1 })

	srv.Kill()
	// Local routing goes on: a hits its own prefix, b the shared one.
	if addr, r := a.route(t, prefix(0)+" again"); addr != first || r != cacheaware.CacheHit {
		t.Errorf("a with Redis away: %s %v, want hit on %s", addr, r, first)
	}
	if addr, r := b.route(t, prefix(0)+" via b"); addr != first || r != cacheaware.CacheHit {
		t.Errorf("b with Redis away: %s %v, want hit on %s", addr, r, first)
	}
	late, _ := a.route(t, prefix(1))
	waitFor(t, "a sees Redis away", func() bool { return !a.s.Stats().Connected })

	srv2, err := redistest.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv2.Kill)
	// The restarted server is empty: b resumes from its last id, which
	// the new stream's ids pass (they are time-based), so it gets the
	// entries a kept in its buffer.
	waitFor(t, "b applied what a learned while Redis was away", func() bool {
		d := b.peek(prefix(1) + " after")
		return d.Reason == cacheaware.CacheHit && d.Addr == late
	})
	if st := a.s.Stats(); !st.Connected || st.Pending != 0 {
		t.Errorf("a after Redis returned: %+v", st)
	}
}

// The publish buffer is bounded: with no Redis, the oldest entries go.
func TestBufferBounded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	s := New(Config{Conn: redisconn.Config{Addrs: []string{addr}}, Pool: "p", Buffer: 8, MaxText: 16},
		func(string, string, string, string, bool) { t.Error("applied without Redis") })
	defer s.Close()
	for i := range 100 {
		s.Publish("m", fmt.Sprintf("%03d %s", i, strings.Repeat("x", 1000)), "r1:1", "")
	}
	st := s.Stats()
	if st.Pending != 8 || st.Dropped != 92 || st.Published != 0 || st.Connected {
		t.Errorf("stats %+v, want 8 pending, 92 dropped", st)
	}
}

// A published entry holds at most MaxText characters of the prompt.
func TestPublishedTextBounded(t *testing.T) {
	tg := redistest.Targets(t)[0]
	pool := uniquePool(t)
	s := New(Config{Conn: tg.Conn, Pool: pool, MaxText: 16}, func(string, string, string, string, bool) {})
	defer s.Close()
	s.Publish("m", strings.Repeat("é", 1000), "r1:1", "")
	waitFor(t, "published", func() bool { return s.Stats().Published == 1 })
	cl := redistest.Client(t, tg.Conn)
	es, err := cl.Do(context.Background(), cl.B().Xrange().Key(Key("", pool)).Start("-").End("+").Build()).AsXRange()
	if err != nil || len(es) != 1 {
		t.Fatalf("stream: %v %v", es, err)
	}
	if n := len([]rune(es[0].FieldValues["t"])); n != 16 {
		t.Errorf("entry of %d runes, want 16 (MaxText)", n)
	}
}

// The stream stays near StreamLen entries.
func TestStreamTrimmed(t *testing.T) { redistest.Each(t, testStreamTrimmed) }

func testStreamTrimmed(t *testing.T, tg redistest.Target) {
	pool := uniquePool(t)
	s := New(Config{Conn: tg.Conn, Pool: pool, StreamLen: 100, Buffer: 5000}, func(string, string, string, string, bool) {})
	defer s.Close()
	for i := range 2000 {
		s.Publish("m", fmt.Sprint("text ", i), "r1:1", "")
	}
	waitFor(t, "published", func() bool { return s.Stats().Published == 2000 })
	cl := redistest.Client(t, tg.Conn)
	n, err := cl.Do(context.Background(), cl.B().Xlen().Key(Key("", pool)).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	// MAXLEN ~ trims whole macro nodes (100 entries each by default).
	if n > 300 {
		t.Errorf("stream holds %d entries, bound ~100", n)
	}
}

// Close stops every goroutine the sharer started, connected or not.
// (Single server only: it is about goroutines, not Redis.)
func TestCloseLeavesNoGoroutine(t *testing.T) {
	tg := redistest.Targets(t)[0]
	s1 := New(Config{Conn: tg.Conn, Pool: uniquePool(t)}, func(string, string, string, string, bool) {})
	waitFor(t, "connected", func() bool { return s1.Stats().Connected })
	s1.Publish("m", "x", "r1:1", "")
	s2 := New(Config{Conn: redisconn.Config{Addrs: []string{"127.0.0.1:1"}}, Pool: "p"}, func(string, string, string, string, bool) {})
	s1.Close()
	s2.Close()
	s2.Close() // idempotent
	waitFor(t, "no sharer goroutine", func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "streamrelay.(*Relay)")
	})
}

// Applied decisions obey the local bound and the local replica set: an
// instance's tree stays within max_tree_size however much the others
// publish, and decisions for a replica it removed are ignored.
func TestAppliedWithinBoundAndSet(t *testing.T) { redistest.Each(t, testAppliedWithinBoundAndSet) }

func testAppliedWithinBoundAndSet(t *testing.T, tg redistest.Target) {
	pool := uniquePool(t)
	a := newInstance(t, tg.Conn, pool)
	b := cacheaware.NewPicker(cacheaware.Config{MaxTreeSize: 4000}, tracker.Config{})
	b.SetReplicas(replicas[:3]) // b has removed r4
	sb := New(Config{Conn: tg.Conn, Pool: pool}, b.PeerRouted)
	t.Cleanup(sb.Close)
	for i := range 60 {
		a.route(t, prefix(i)) // ~500 characters each: 30,000 in all
	}
	waitFor(t, "b applied all 60", func() bool { return sb.Stats().Applied == 60 })
	st := b.Router().Stats()
	if st.Chars > 4000 {
		t.Errorf("b's tree holds %d characters, bound 4000", st.Chars)
	}
	if n := st.ReplicaChars["r4:1"]; n != 0 {
		t.Errorf("b holds %d characters for the removed replica", n)
	}
	if st.EvictedChars == 0 {
		t.Error("nothing evicted: the test did not pass the bound")
	}
}

// A client's model string is published at most MaxModelBytes long (the
// local tree keys on no more): a client must not fill the Redis that
// global_redis_least and the flow gate share with request-sized names. A
// peer's entries are bounded the same way on the way in.
func TestModelNameBoundedInTheStream(t *testing.T) { redistest.Each(t, testModelNameBounded) }

func testModelNameBounded(t *testing.T, tg redistest.Target) {
	pool := uniquePool(t)
	huge := strings.Repeat("é", 1<<19) // 1 MiB
	var got []string
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	reader := New(Config{Conn: tg.Conn, Pool: pool}, func(model, _, _, _ string, _ bool) {
		<-mu
		got = append(got, model)
		mu <- struct{}{}
	})
	defer reader.Close()
	s := New(Config{Conn: tg.Conn, Pool: pool}, func(string, string, string, string, bool) {})
	defer s.Close()
	s.Publish(huge, "a prompt", "r1:1", "")
	waitFor(t, "published", func() bool { return s.Stats().Published == 1 })
	cl := redistest.Client(t, tg.Conn)
	entries, err := cl.Do(context.Background(), cl.B().Xrange().Key(Key("", pool)).Start("-").End("+").Build()).AsXRange()
	if err != nil || len(entries) != 1 {
		t.Fatalf("stream: %v %v", entries, err)
	}
	if m := entries[0].FieldValues["m"]; len(m) > MaxModelBytes || !strings.HasPrefix(huge, m) || m == "" {
		t.Fatalf("published model of %d bytes, want a prefix of at most %d", len(m), MaxModelBytes)
	}
	// A peer (or a hostile writer) that put a huge name in the stream: the
	// reader bounds it before it reaches the tree. (An entry over the
	// stream's record bound is skipped whole: lb/streamrelay's tests.)
	if err := cl.Do(context.Background(), cl.B().Xadd().Key(Key("", pool)).Id("*").FieldValue().
		FieldValue("i", "other").FieldValue("m", huge[:64<<10]).FieldValue("t", strings.Repeat("x", 1<<15)).FieldValue("a", "r2:1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reader to apply both", func() bool { return reader.Stats().Applied >= 2 })
	<-mu
	defer func() { mu <- struct{}{} }()
	for _, m := range got {
		if len(m) > MaxModelBytes {
			t.Fatalf("applied a model of %d bytes", len(m))
		}
	}
}

// A sharer that starts on a stream with history tells its user which
// decisions are replayed history and which are news: a peer's decision
// made long ago says nothing of what an engine is computing now.
func TestReplayedDecisionsAreMarkedHistory(t *testing.T) {
	redistest.Each(t, testReplayedDecisionsAreMarkedHistory)
}

func testReplayedDecisionsAreMarkedHistory(t *testing.T, tg redistest.Target) {
	pool := uniquePool(t)
	s := New(Config{Conn: tg.Conn, Pool: pool}, func(string, string, string, string, bool) {})
	defer s.Close()
	for i := range 5 {
		s.Publish("m", fmt.Sprint("old ", i), "r1:1", "")
	}
	waitFor(t, "5 published", func() bool { return s.Stats().Published == 5 })

	type entry struct {
		text    string
		history bool
	}
	got := make(chan entry, 16)
	late := New(Config{Conn: tg.Conn, Pool: pool}, func(_, text, _, _ string, history bool) { got <- entry{text, history} })
	defer late.Close()
	for range 5 {
		if e := <-got; !e.history || !strings.HasPrefix(e.text, "old ") {
			t.Fatalf("replayed %+v, want history", e)
		}
	}
	waitFor(t, "the late sharer to catch up", func() bool { return late.Stats().Applied == 5 })
	s.Publish("m", "new", "r1:1", "")
	if e := <-got; e.history || e.text != "new" {
		t.Fatalf("news %+v, want not history", e)
	}
}
