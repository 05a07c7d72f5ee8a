package redisleast

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testRedis is the shared Redis every test uses (each under its own key
// prefix).
func testRedis(t testing.TB) string { return redistest.Addr(t) }

// privateRedis starts a redis-server of the test's own (for tests that
// stop and restart it); killed at the end of the test.
func privateRedis(t *testing.T) *redistest.Server { return redistest.Private(t) }

// testConfig is a config for the single server at addr under a key
// prefix unique to the test.
func testConfig(t testing.TB, addr string) Config {
	return confFor(t, single(addr))
}

// single is the target of one server at addr (the shared one, or a
// private one a test stops and restarts).
func single(addr string) redistest.Target {
	return redistest.Target{Name: "single", Conn: redisconn.Config{Addrs: []string{addr}}}
}

// confFor is a config for the target under a key prefix unique to the
// test.
func confFor(t testing.TB, tg redistest.Target) Config {
	conn := tg.Conn
	conn.KeyPrefix = fmt.Sprintf("test-%s-%d", t.Name(), time.Now().UnixNano())
	conn.ReadTimeout = 2 * time.Second
	return Config{Config: conn, InstanceID: "t"}
}

func newStore(t testing.TB, cfg Config, pool string) *Store {
	t.Helper()
	s, err := New(context.Background(), cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// crash stops the instance the way a killed process would: no more
// renewals, no releases, the liveness key left to expire.
func (s *Store) crash() {
	s.life.Lock()
	s.closed.Store(true)
	s.life.Unlock()
	close(s.done)
	s.wg.Wait()
	s.rc().Close()
}

// raw is a plain client of the single server at addr for inspecting keys.
func raw(t testing.TB, addr string) rueidis.Client { return rawFor(t, single(addr)) }

// rawFor is a plain client of the target (cluster-aware) for inspecting
// keys.
func rawFor(t testing.TB, tg redistest.Target) rueidis.Client { return redistest.Client(t, tg.Conn) }

// waitFor polls cond until it holds; the deadline only prevents a hang.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustCounts(t testing.TB, s *Store) map[string]int64 {
	t.Helper()
	c, err := s.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// drained reports whether every member is at 0 and nothing is recorded
// or draining.
func drained(t testing.TB, s *Store, c rueidis.Client) bool {
	for _, n := range mustCounts(t, s) {
		if n != 0 {
			return false
		}
	}
	ctx := context.Background()
	if n, _ := c.Do(ctx, c.B().Zcard().Key(s.k.gone).Build()).AsInt64(); n != 0 {
		return false
	}
	keys, err := redistest.Keys(ctx, c, s.k.tag+":inst:*")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		kv, _ := c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
		for f, v := range kv {
			// "" is a tombstone, "#" the last batch's number and "!" the
			// records' version, not requests.
			if f != "#" && f != "!" && v != "" {
				return false
			}
		}
	}
	return true
}
