package redistest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/flow/redisgate"
	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware/share"
	"github.com/sluice-router/sluice/lb/kvevents"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redisleast"
	"github.com/sluice-router/sluice/lb/redistest"
	"github.com/sluice-router/sluice/lb/streamrelay"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// sluiceACL is the ACL of a Redis user restricted to what Sluice's Redis
// features need (global_redis_least in both modes, cache_aware's
// sharing, flow_control's shared capacity, kv_events' relay), after the
// user name and its password; docs/redis.md shows it.
// Keys and pub/sub channels: only Sluice's (every one starts with the hash
// tag "{sluice:<key_prefix>:<pool>}"). Commands: those the clients send
// (EVALSHA and EVAL of the scripts, SET/DEL of the liveness key, SMEMBERS,
// ZCARD, ZRANGE, HMGET, PING, SUBSCRIBE, XADD, XREAD, XREVRANGE (a relay
// started "from now" reads the newest record's id), TIME (the flow
// gate's script reads Redis's clock), and CLUSTER SLOTS /
// SHARDS for a cluster client's topology: rueidis asks CLUSTER SLOTS of
// Redis 7 and CLUSTER SHARDS of Redis 8 and later; on a single server the
// denied CLUSTER SLOTS would fill the ACL log) and those the scripts call.
// Each one is needed: without any one but cluster|shards (Redis 7 here),
// exercise fails or Redis logs a denial.
const sluiceACL = "~{sluice:* &{sluice:* -@all" +
	" +evalsha +eval +ping +subscribe +set +del +smembers +zcard +zrange +hmget +xadd +xread +xrevrange" +
	" +exists +hdel +hexists +hget +hgetall +hincrby +hlen +hset +hvals +lindex +llen +lpop +lrem" +
	" +publish +rpush +sadd +srem +zadd +zincrby +zrangebyscore +zrem +zscore" +
	" +time +cluster|slots +cluster|shards"

// setUser creates (or resets) user with the rules on every node of admin.
// userConn is srv's connection as a new user with rules (and the wrong
// password when wrongPassword).
func userConn(t *testing.T, srv *redistest.TLSServer, admin rueidis.Client, rules string, wrongPassword bool) redisconn.Config {
	t.Helper()
	user := fmt.Sprint("sluice-", time.Now().UnixNano())
	setUser(t, admin, user, "right", rules)
	conn := srv.Conn()
	conn.Username, conn.Password = user, "right"
	if wrongPassword {
		conn.Password = "wrong"
	}
	return conn
}

func setUser(t *testing.T, admin rueidis.Client, user, password, rules string) {
	t.Helper()
	ctx := context.Background()
	for _, n := range admin.Nodes() {
		args := append([]string{"reset", "on", ">" + password}, strings.Fields(rules)...)
		if err := n.Do(ctx, n.B().AclSetuser().Username(user).Rule(args...).Build()).Error(); err != nil {
			t.Fatalf("ACL SETUSER %s: %v", user, err)
		}
	}
	t.Cleanup(func() {
		for _, n := range admin.Nodes() {
			n.Do(context.Background(), n.B().AclDeluser().Username(user).Build())
		}
	})
}

// denials are the ACL LOG entries of user on every node of admin.
func denials(t *testing.T, admin rueidis.Client, user string) []string {
	t.Helper()
	var out []string
	for _, n := range admin.Nodes() {
		entries, err := n.Do(context.Background(), n.B().AclLog().Count(1000).Build()).ToArray()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			m, err := e.AsMap()
			if err != nil {
				t.Fatal(err)
			}
			u, reason, object := m["username"], m["reason"], m["object"]
			if name, _ := u.ToString(); name != user {
				continue
			}
			r, _ := reason.ToString()
			o, _ := object.ToString()
			out = append(out, r+" "+o)
		}
	}
	return out
}

// exercise runs every Redis-backed feature of Sluice through conn and
// fails the test when one does not work: global_redis_least's plain mode
// (sync, select, release, counts, reaping a closed instance's request) and
// queueing mode (queue, cancel, avoid, recheck, kick, reap, hand-over
// through pub/sub), and cache_aware's sharing (stream XADD, XREAD). Every
// command of the ACL is used on the way (admin breaks subscriptions).
func exercise(t *testing.T, conn redisconn.Config, admin rueidis.Client) {
	t.Helper()
	ctx := context.Background()
	conn.KeyPrefix = fmt.Sprintf("acl-%d", time.Now().UnixNano())
	conn.ReadTimeout = 2 * time.Second
	newStore := func(cfg redisleast.Config, pool, id string) *redisleast.Store {
		t.Helper()
		cfg.Config, cfg.InstanceID = conn, id
		s, err := redisleast.New(ctx, cfg, pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Unreachable(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ok := lb.Outcome{Kind: lb.Success}
	sum := func(s *redisleast.Store) int64 {
		c, err := s.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := int64(0)
		for _, v := range c {
			n += v
		}
		return n
	}

	// Plain mode, and a closed instance's request reclaimed by another.
	plain := redisleast.Config{LeaseTTL: 300 * time.Millisecond}
	a, b := newStore(plain, "plain", "a"), newStore(plain, "plain", "b")
	if err := a.Sync(ctx, []string{"r1", "r2"}); err != nil {
		t.Fatal(err)
	}
	l, err := a.Select(ctx, []string{"r1", "r2"})
	if err != nil || l.Fallback {
		t.Fatalf("select: %v (fallback %v)", err, l != nil && l.Fallback)
	}
	abandoned, err := a.Select(ctx, []string{"r1", "r2"})
	if err != nil || abandoned.Fallback {
		t.Fatalf("select: %v", err)
	}
	l.Release(ok)
	a.Close() // its liveness key goes: b's reaper reclaims the abandoned request
	waitFor("b to reclaim a's request", func() bool { return sum(b) == 0 })
	abandoned.Release(ok)
	if st := b.Stats(); st.Reclaimed != 1 || st.Errors != 0 {
		t.Fatalf("b: %+v", st)
	}
	if err := b.Sync(ctx, []string{"r1"}); err != nil { // r2 leaves the pool
		t.Fatal(err)
	}

	// Queueing mode. Both slots busy; a cancelled waiter leaves the queue;
	// a waiter for q2 only (so it must avoid q1) is queued, its
	// subscription broken (the recheck at resubscription looks it up), q1
	// freed (not for it), then x closes holding q2: the reaper reclaims
	// it and hands it to the waiter through pub/sub. The maintenance loop
	// kicks the queue every LeaseTTL/3 meanwhile.
	queue := redisleast.Config{MaxInflight: 1, QueueTimeout: 10 * time.Second, LeaseTTL: 300 * time.Millisecond}
	x, y := newStore(queue, "queue", "x"), newStore(queue, "queue", "y")
	for _, s := range []*redisleast.Store{x, y} { // each instance syncs its backend set
		if err := s.Sync(ctx, []string{"q1", "q2"}); err != nil {
			t.Fatal(err)
		}
	}
	var held []*redisleast.Lease
	for _, q := range []string{"q1", "q2"} {
		l, err := x.Select(ctx, []string{q})
		if err != nil || l.Fallback || l.Addr != q {
			t.Fatalf("select %s: %v %+v", q, err, l)
		}
		held = append(held, l)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := y.Select(cctx, []string{"q1", "q2"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	cancel()
	type result struct {
		l   *redisleast.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := y.Select(ctx, []string{"q2"})
		got <- result{l, err}
	}()
	waitFor("the waiter to queue", func() bool { return y.Stats().Waiting == 1 })
	for _, n := range admin.Nodes() {
		if err := n.Do(ctx, n.B().ClientKill().TypePubsub().Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // resubscribed (backoff 250ms at most)
	held[0].Release(ok)
	x.Close()
	held[1].Release(ok)
	g := <-got
	if g.err != nil || g.l.Addr != "q2" || g.l.Fallback {
		t.Fatalf("waiter: %v %+v", g.err, g.l)
	}
	g.l.Release(ok)
	waitFor("counts back to 0", func() bool { return sum(y) == 0 })
	// (The reaper's reply may come after the notification it caused.)
	waitFor("y to count the reclaimed request", func() bool { return y.Stats().Reclaimed == 1 })
	if st := y.Stats(); st.Errors != 0 || st.Fallbacks != 0 || st.Handovers != 1 {
		t.Fatalf("y: %+v", st)
	}

	// cache_aware's sharing: what one instance publishes the other applies.
	var applied atomic.Int64
	p := share.New(share.Config{Conn: conn, Pool: "p"}, func(string, string, string, string, bool) {})
	t.Cleanup(p.Close)
	r := share.New(share.Config{Conn: conn, Pool: "p"}, func(string, string, string, string, bool) { applied.Add(1) })
	t.Cleanup(r.Close)
	for i := range 3 {
		p.Publish("m", fmt.Sprint("prompt ", i), "r1", "")
	}
	waitFor("the other sharer to apply 3 entries", func() bool { return applied.Load() == 3 })
	for _, s := range []*share.Sharer{p, r} {
		if st := s.Stats(); st.Errors != 0 || !st.Connected {
			t.Fatalf("sharer %+v", st)
		}
	}

	// kv_events' relay, started "from now" as it is for an index that
	// already holds events (a reload that changed the connection): it
	// first reads the newest record's id, then applies only what follows.
	key := kvevents.RelayKey(conn.KeyPrefix, "p")
	pub := streamrelay.New(streamrelay.Config{Conn: conn, Key: key}, func(map[string]string, bool) {})
	t.Cleanup(pub.Close)
	pub.Publish("t", "old")
	waitFor("the relay's first record published", func() bool { return pub.Stats().Published == 1 })
	var news atomic.Int64
	late := streamrelay.New(streamrelay.Config{Conn: conn, Key: key, FromNow: true}, func(f map[string]string, _ bool) {
		if f["t"] == "new" {
			news.Add(1)
		}
	})
	t.Cleanup(late.Close)
	// Positioned at the newest record (Connected alone comes with the
	// client, before the reader's XREVRANGE: a record published then
	// would be taken for history already there).
	waitFor("the late relay to position itself", func() bool { return late.Stats().LastID != "0-0" })
	pub.Publish("t", "new")
	waitFor("the late relay to apply the new record", func() bool { return news.Load() == 1 })
	if st := late.Stats(); st.Errors != 0 || st.Applied != 1 {
		t.Fatalf("relay from now: %+v", st)
	}

	// flow_control's shared capacity: two instances claim and give back
	// their shares of a pool of 2.
	var gates []*redisgate.Gate
	var ctls []*flow.Controller
	for i := range 2 {
		g, err := redisgate.New(redisgate.Config{Conn: conn, Pool: "p", Instance: fmt.Sprint("g", i), LeaseTTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		fc := flow.Config{Detector: flow.DetectorConfig{Type: flow.DetectorConcurrency, MaxConcurrency: 1}}
		g.SetLocal(flow.NewConcurrencyDetector(fc.Detector, func() int { return 2 }))
		c, err := flow.New(fc, g, flow.PublishDemand(g.Feed()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); g.Close() })
		gates, ctls = append(gates, g), append(ctls, c)
	}
	var tickets []*flow.Ticket
	for _, c := range ctls {
		tk, err := c.Enqueue(ctx, flow.Request{})
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
	}
	for _, tk := range tickets {
		tk.Release()
	}
	waitFor("the gates to give their shares back", func() bool {
		return gates[0].Stats().Held == 0 && gates[1].Stats().Held == 0
	})
	for _, g := range gates {
		if st := g.Stats(); st.RedisErrors != 0 || st.Fallback || st.Claims == 0 {
			t.Fatalf("gate %+v", st)
		}
	}
}

// The ACL user docs/redis.md gives runs every Redis feature of Sluice,
// on a TLS-only redis-server (tls, ca_file) whose default user has
// another password, and on the single server and the cluster of the
// tests; Redis logs no denied command or key of that user.
func TestACLUserRunsEveryRedisFeature(t *testing.T) {
	type target struct {
		name  string
		conn  redisconn.Config
		admin rueidis.Client
	}
	srv := redistest.StartTLS(t)
	tlsConn := srv.Conn()
	admin := redistest.Client(t, tlsConn)
	adminPassword := fmt.Sprint("admin-", time.Now().UnixNano())
	// The default user: another password.
	if err := admin.Do(context.Background(), admin.B().AclSetuser().Username("default").
		Rule("on", ">"+adminPassword).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	tlsConn.Password = adminPassword
	targets := []target{{"tls", srv.Conn(), redistest.Client(t, tlsConn)}}
	for _, tg := range redistest.Targets(t) {
		targets = append(targets, target{tg.Name, tg.Conn, redistest.Client(t, tg.Conn)})
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			user := fmt.Sprint("sluice-test-", time.Now().UnixNano())
			password := fmt.Sprint("pw-", time.Now().UnixNano())
			setUser(t, tg.admin, user, password, sluiceACL)
			conn := tg.conn
			conn.Username, conn.Password = user, password
			exercise(t, conn, tg.admin)
			if d := denials(t, tg.admin, user); len(d) > 0 {
				t.Fatalf("Redis denied the sluice user: %v", d)
			}
		})
	}
}

// docs/redis.md gives the ACL line this package tests.
func TestDocsGiveTheTestedACL(t *testing.T) {
	doc, err := os.ReadFile("../../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	if line := "ACL SETUSER sluice reset on >PASSWORD " + sluiceACL; !strings.Contains(string(doc), line) {
		t.Fatalf("docs/redis.md lacks the tested ACL line:\n%s", line)
	}
}

// A wrong password, or a user lacking something Sluice needs, fails
// global_redis_least's store at once with Redis's own error naming what
// is wrong (so a Caddy load fails naming Redis), instead of hanging or
// serving from local counts for good; cache_aware's sharing, which never
// fails a load, reports it as its last error and stays disconnected.
func TestACLRefusalsAreClearErrors(t *testing.T) {
	srv := redistest.StartTLS(t)
	admin := redistest.Client(t, srv.Conn())
	cases := []struct {
		name, rules string
		queueing    bool
		want        string
	}{
		{"wrong password", sluiceACL, false, "WRONGPASS"},
		{"no zincrby", strings.Replace(sluiceACL, " +zincrby", "", 1), false, "may not run ZINCRBY"},
		{"no evalsha", strings.Replace(sluiceACL, " +evalsha", "", 1), false, "'evalsha' command"},
		{"other keys only", strings.Replace(sluiceACL, "~{sluice:*", "~other:*", 1), false, "NOPERM"},
		{"no channels", strings.Replace(sluiceACL, "&{sluice:*", "resetchannels", 1), false, "channel"},
		{"no subscribe", strings.Replace(sluiceACL, " +subscribe", "", 1), true, "'subscribe' command"},
		{"no xadd", strings.Replace(sluiceACL, " +xadd", "", 1), false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn := userConn(t, srv, admin, c.rules, c.name == "wrong password")
			cfg := redisleast.Config{Config: conn}
			if c.queueing {
				cfg.MaxInflight, cfg.QueueTimeout = 1, time.Second
			}
			start := time.Now()
			s, err := redisleast.New(context.Background(), cfg, "p")
			took := time.Since(start)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("global_redis_least does not need what this user lacks: %v", err)
			case c.want == "":
				s.Close()
			case err == nil:
				s.Close()
				t.Fatal("New succeeded")
			case !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "redis ["+srv.Addr+"]"):
				t.Fatalf("error %q: want it to name Redis (%s) and %q", err, srv.Addr, c.want)
			default:
				t.Logf("%v (after %v)", err, took.Round(time.Millisecond))
			}
			if took > 5*time.Second {
				t.Fatalf("New took %v", took)
			}
			if c.name != "wrong password" && c.name != "no xadd" {
				return
			}
			sh := share.New(share.Config{Conn: conn, Pool: "p"}, func(string, string, string, string, bool) {})
			defer sh.Close()
			sh.Publish("m", "text", "r1", "")
			want := map[string]string{"wrong password": "WRONGPASS", "no xadd": "'xadd' command"}[c.name]
			deadline := time.Now().Add(10 * time.Second)
			for st := sh.Stats(); !strings.Contains(st.LastError, want) || st.Connected; st = sh.Stats() {
				if time.Now().After(deadline) {
					t.Fatalf("sharer stats %+v: want last error %q, disconnected", st, want)
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("sharer: %s", sh.Stats().LastError)
		})
	}
}

// flow_control's gate: a wrong password, or a user lacking a command or
// the pool's keys, is refused when the config loads (CheckAccess) with
// Redis's own error naming what is wrong; it used to start anyway and
// serve on its fallback share for good, NOPERM in its last error. A Redis
// that cannot be reached is not refused: the gate falls back and retries.
func TestFlowGateAccessRefusalsAreClearErrors(t *testing.T) {
	srv := redistest.StartTLS(t)
	admin := redistest.Client(t, srv.Conn())
	cases := []struct{ name, rules, want string }{
		{"wrong password", sluiceACL, "WRONGPASS"},
		{"no time", strings.Replace(sluiceACL, " +time", "", 1), "may not run TIME"},
		{"no zrangebyscore", strings.Replace(sluiceACL, " +zrangebyscore", "", 1), "may not run ZRANGEBYSCORE"},
		{"no evalsha", strings.Replace(sluiceACL, " +evalsha", "", 1), "'evalsha' command"},
		{"other keys only", strings.Replace(sluiceACL, "~{sluice:*", "~other:*", 1), "NOPERM"},
		{"everything it needs", sluiceACL, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn := userConn(t, srv, admin, c.rules, c.name == "wrong password")
			err := redisgate.CheckAccess(context.Background(), redisgate.Config{Conn: conn, Pool: "p"})
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("the gate does not need what this user lacks: %v", err)
			case c.want == "":
			case err == nil:
				t.Fatal("CheckAccess accepted the user")
			case !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "redis ["+srv.Addr+"]"):
				t.Fatalf("error %q: want it to name Redis (%s) and %q", err, srv.Addr, c.want)
			default:
				t.Log(err)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		conn := redisconn.Config{Addrs: []string{"127.0.0.1:1"}, DialTimeout: 200 * time.Millisecond}
		if err := redisgate.CheckAccess(context.Background(), redisgate.Config{Conn: conn, Pool: "p"}); err != nil {
			t.Fatalf("unreachable Redis refused: %v (the gate falls back instead)", err)
		}
	})
}
