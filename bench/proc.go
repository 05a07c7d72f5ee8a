package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// proc is one child process the harness started. It is stopped by its own
// PID (SIGTERM, then SIGKILL), never by name.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has been reaped
	waitErr error

	stopping atomic.Bool // set before the harness signals it
	early    atomic.Bool // it exited before the harness asked it to
}

// procStats counts what the harness started and how it ended.
type procStats struct {
	Started int `json:"started"`
	Stopped int `json:"stopped"` // reaped after the harness asked
	Killed  int `json:"killed"`  // needed SIGKILL (counted in Stopped too)
	Early   int `json:"exited_early"`
	Stuck   int `json:"not_stopped"` // still not reaped after SIGKILL: an error
}

// procs starts and stops the child processes of one scenario.
type procs struct {
	dir string // logs and per-process files

	mu    sync.Mutex
	live  []*proc
	stats procStats
}

func (m *procs) start(name string, env []string, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(m.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Its own process group: a Ctrl-C in the terminal reaches only the
	// harness, which then stops its children itself, in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		f.Close()
		if !p.stopping.Load() {
			p.early.Store(true)
		}
		close(p.done)
	}()
	m.mu.Lock()
	m.live = append(m.live, p)
	m.stats.Started++
	m.mu.Unlock()
	return p, nil
}

// alive returns an error naming the first process that exited on its own.
func (m *procs) alive() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.live {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during the run (%v); log: %s\n%s", p.name, p.waitErr, p.logPath, tail(p.logPath))
		default:
		}
	}
	return nil
}

// stopAll stops every live process (in parallel, each by its PID) and
// waits at most about 2×grace for all of them.
func (m *procs) stopAll(grace time.Duration) {
	m.mu.Lock()
	list := m.live
	m.live = nil
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			killed, err := p.stop(grace)
			m.mu.Lock()
			defer m.mu.Unlock()
			switch {
			case err != nil:
				m.stats.Stuck++
			case p.early.Load():
				m.stats.Early++
			default:
				m.stats.Stopped++
				if killed {
					m.stats.Killed++
				}
			}
		}()
	}
	wg.Wait()
}

func (m *procs) snapshot() procStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// stop sends SIGTERM to the process's PID, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) (killed bool, err error) {
	p.stopping.Store(true)
	select {
	case <-p.done:
		return false, nil
	default:
	}
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return false, nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return true, nil
	case <-time.After(grace):
		return true, fmt.Errorf("%s (pid %d) still running after SIGKILL", p.name, pid)
	}
}

// waitListening waits until addr accepts TCP connections, the process
// exits, or timeout.
func waitListening(ctx context.Context, p *proc, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before listening on %s (%v)\n%s", p.name, addr, p.waitErr, tail(p.logPath))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: nothing listening on %s after %v\n%s", p.name, addr, timeout, tail(p.logPath))
		}
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func freePorts(n int) ([]int, error) {
	// Hold all listeners until every port is picked, so they differ, and
	// never hand out a port twice in this process: a port released here
	// is free until its user binds it, and a later call (the proxies of
	// the same system) would otherwise get it again (CI: a kv-events
	// engine found its port taken by a proxy started before it).
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	handedMu.Lock()
	defer handedMu.Unlock()
	var ports []int
	for len(ports) < n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		if len(lns) > n+1024 {
			return nil, fmt.Errorf("free ports: no new port in %d tries", len(lns))
		}
		p := ln.Addr().(*net.TCPAddr).Port
		if handed[p] {
			continue
		}
		handed[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// handed are the ports freePorts returned so far in this process.
var (
	handedMu sync.Mutex
	handed   = map[int]bool{}
)

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return "  | " + strings.Join(lines, "\n  | ")
}

var errSkipped = errors.New("skipped")
