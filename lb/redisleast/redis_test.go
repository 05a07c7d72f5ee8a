package redisleast

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
)

// sharedAddr is the Redis every test uses (each under its own key prefix):
// SLUICE_TEST_REDIS_ADDR, or a private server started by TestMain.
var sharedAddr string

func TestMain(m *testing.M) {
	sharedAddr = os.Getenv("SLUICE_TEST_REDIS_ADDR")
	var srv *redisServer
	if sharedAddr == "" {
		if _, err := exec.LookPath("redis-server"); err == nil {
			srv, err = startRedis("")
			if err != nil {
				fmt.Fprintln(os.Stderr, "redisleast tests: starting redis-server:", err)
				os.Exit(1)
			}
			sharedAddr = srv.addr
		}
	}
	code := m.Run()
	if srv != nil {
		srv.kill()
	}
	os.Exit(code)
}

// testRedis returns the shared Redis address, or skips (fails under CI)
// when there is none.
func testRedis(t testing.TB) string {
	t.Helper()
	if sharedAddr != "" {
		return sharedAddr
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no Redis: set SLUICE_TEST_REDIS_ADDR (scripts/redis-test-server.sh) or install redis-server")
	}
	t.Skip("no Redis: set SLUICE_TEST_REDIS_ADDR or install redis-server")
	return ""
}

// redisServer is a private redis-server process on loopback, no persistence.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
}

// startRedis starts redis-server on addr ("" = a free loopback port) and
// waits until it answers PING.
func startRedis(addr string) (*redisServer, error) {
	if addr == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addr = l.Addr().String()
		l.Close()
	}
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--logfile", "")
	cmd.Dir = os.TempDir()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &redisServer{addr: addr, cmd: cmd}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ping(addr) {
			return s, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.kill()
	return nil, fmt.Errorf("redis-server on %s did not answer PING within 10s", addr)
}

func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

func (s *redisServer) kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

func (s *redisServer) signal(sig syscall.Signal) { _ = s.cmd.Process.Signal(sig) }

// privateRedis starts a redis-server of the test's own (for tests that
// stop and restart it); killed at the end of the test.
func privateRedis(t *testing.T) *redisServer {
	t.Helper()
	testRedis(t) // same skip rules
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("this test needs redis-server on PATH")
		}
		t.Skip("this test needs redis-server on PATH")
	}
	s, err := startRedis("")
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { s.kill() }) })
	return s
}

// testConfig is a config for addr under a key prefix unique to the test.
func testConfig(t testing.TB, addr string) Config {
	return Config{Config: redisconn.Config{Addrs: []string{addr}, KeyPrefix: fmt.Sprintf("test-%s-%d", t.Name(), time.Now().UnixNano()),
		ReadTimeout: 2 * time.Second}, InstanceID: "t"}
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

// raw is a plain client for inspecting keys.
func raw(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

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
	keys, _ := c.Do(ctx, c.B().Keys().Pattern(s.k.tag+":inst:*").Build()).AsStrSlice()
	for _, k := range keys {
		vals, _ := c.Do(ctx, c.B().Hvals().Key(k).Build()).AsStrSlice()
		for _, v := range vals {
			if v != "" { // "" is a tombstone, not a request
				return false
			}
		}
	}
	return true
}
