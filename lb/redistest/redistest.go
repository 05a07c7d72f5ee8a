// Package redistest gives tests real Redis deployments on loopback: the
// shared single server (SLUICE_TEST_REDIS_ADDR, or one started for the
// test binary), a Redis Cluster when scripts/test.sh started one
// (SLUICE_TEST_REDIS_CLUSTER_ADDRS), and private servers a test may stop
// and restart. No mocks: every Redis-backed feature is tested against
// what it will meet in production.
package redistest

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

// shared is the single server of this test binary.
var (
	sharedAddr string
	sharedSrv  *Server
)

// Main runs a package's tests and exits (call it from TestMain); see Run.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run runs a package's tests: it starts a private redis-server when
// SLUICE_TEST_REDIS_ADDR is unset and stops it when the tests end, so no
// child process outlives the test binary.
func Run(m *testing.M) int {
	sharedAddr = os.Getenv("SLUICE_TEST_REDIS_ADDR")
	if sharedAddr == "" {
		if _, err := exec.LookPath("redis-server"); err == nil {
			srv, err := Start("")
			if err != nil {
				fmt.Fprintln(os.Stderr, "redistest: starting redis-server:", err)
				return 1
			}
			sharedSrv, sharedAddr = srv, srv.Addr
		}
	}
	code := m.Run()
	if sharedSrv != nil {
		sharedSrv.Kill()
	}
	return code
}

// Addr returns the shared single server's address, or skips the test
// (fails it under CI=true) when there is none.
func Addr(t testing.TB) string {
	t.Helper()
	if sharedAddr != "" {
		return sharedAddr
	}
	need(t, "no Redis: set SLUICE_TEST_REDIS_ADDR (scripts/redis-test-server.sh) or install redis-server")
	return ""
}

// Target is one Redis deployment a test runs against.
type Target struct {
	Name string // "single" or "cluster"
	Conn redisconn.Config
}

// Targets are the deployments every Redis-backed feature is tested
// against: the single server, and the Redis Cluster scripts/test.sh starts
// (scripts/redis-cluster-test.sh, SLUICE_TEST_REDIS_CLUSTER_ADDRS); run
// the test once per target (Each). Under CI=true a missing cluster fails
// the test, so CI cannot quietly stop testing it; elsewhere the cluster
// target is left out.
func Targets(t testing.TB) []Target {
	t.Helper()
	ts := []Target{{Name: "single", Conn: redisconn.Config{Addrs: []string{Addr(t)}}}}
	if addrs := ClusterAddrs(); len(addrs) > 0 {
		ts = append(ts, Target{Name: "cluster", Conn: redisconn.Config{Addrs: addrs}})
	} else if os.Getenv("CI") == "true" {
		t.Fatal("no Redis Cluster under CI=true: set SLUICE_TEST_REDIS_CLUSTER_ADDRS (eval \"$(scripts/redis-cluster-test.sh)\", as scripts/test.sh does)")
	}
	return ts
}

// Each runs fn as one subtest per target (named after it).
func Each(t *testing.T, fn func(t *testing.T, tg Target)) {
	t.Helper()
	for _, tg := range Targets(t) {
		t.Run(tg.Name, func(t *testing.T) { fn(t, tg) })
	}
}

// Client is a plain client of conn for inspecting keys (a cluster client
// on a cluster), closed at the end of the test.
func Client(t testing.TB, conn redisconn.Config) rueidis.Client {
	t.Helper()
	opt, err := conn.WithDefaults().ClientOption(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Keys runs KEYS pattern on every node of c (on a cluster each node
// answers for its own slots only) and returns the union.
func Keys(ctx context.Context, c rueidis.Client, pattern string) ([]string, error) {
	var out []string
	for _, n := range c.Nodes() {
		ks, err := n.Do(ctx, n.B().Keys().Pattern(pattern).Build()).AsStrSlice()
		if err != nil {
			return nil, err
		}
		out = append(out, ks...)
	}
	return out, nil
}

// ClusterAddrs are the cluster's nodes (SLUICE_TEST_REDIS_CLUSTER_ADDRS,
// comma-separated), nil when no cluster was started.
func ClusterAddrs() []string {
	v := strings.TrimSpace(os.Getenv("SLUICE_TEST_REDIS_CLUSTER_ADDRS"))
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

func need(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// Server is a private redis-server process on loopback, no persistence.
type Server struct {
	Addr string
	cmd  *exec.Cmd
}

// Start starts redis-server on addr ("" = a free loopback port) with the
// extra arguments, and waits until it answers PING.
func Start(addr string, args ...string) (*Server, error) {
	if addr == "" {
		var err error
		if addr, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	_, port, _ := net.SplitHostPort(addr)
	return start(addr, Ping, append([]string{"--port", port}, args...))
}

// freeAddr is a loopback address nothing listens on (now).
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// start runs redis-server on loopback without persistence with args
// (which name the port) and waits until ping(addr) holds.
func start(addr string, ping func(string) bool, args []string) (*Server, error) {
	argv := append([]string{"--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--logfile", ""}, args...)
	cmd := exec.Command("redis-server", argv...)
	cmd.Dir = os.TempDir()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Addr: addr, cmd: cmd}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ping(addr) {
			return s, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Kill()
	return nil, fmt.Errorf("redis-server on %s did not answer PING within 10s", addr)
}

// Private starts a redis-server of the test's own (for tests that stop
// and restart it); killed at the end of the test.
func Private(t *testing.T) *Server {
	t.Helper()
	Addr(t) // same skip rules
	if _, err := exec.LookPath("redis-server"); err != nil {
		need(t, "this test needs redis-server on PATH")
	}
	s, err := Start("")
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { s.Kill() }) })
	return s
}

// Ping reports whether a Redis answers PING on addr (plain TCP, no auth).
func Ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	return ping(c)
}

func ping(c net.Conn) bool {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// Kill stops the server (SIGKILL) and waits for it.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// Signal sends sig (e.g. SIGSTOP to freeze it, SIGCONT to thaw it).
func (s *Server) Signal(sig syscall.Signal) { _ = s.cmd.Process.Signal(sig) }
