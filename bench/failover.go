package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/redis/rueidis"
)

// failover is one chaos system's Redis failover: a replica of the
// primary, frozen so that it lags, promoted when the primary dies, with
// the front moved to it; restore puts the primary back for the next
// system.
type failover struct {
	replica     *proc
	primaryBin  string
	primaryArgs []string
}

// run starts the replica, waits until it is in sync, freezes it for lag
// (the primary keeps taking writes), then kills the primary, promotes the
// replica and moves the front to it.
func (fo *failover) run(ctx context.Context, r *runner, front *tcpFront, lag time.Duration) error {
	primary := r.redisProc()
	if primary == nil {
		return errors.New("failover: no redis-server running")
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	host, primaryPort, _ := strings.Cut(r.redis, ":")
	dir := filepath.Join(r.tmp, "redis-replica")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rp, err := r.infra.start("redis-replica", nil, primary.cmd.Path, "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "yes", "--replicaof", host, primaryPort)
	if err != nil {
		return err
	}
	fo.replica = rp
	if err := waitListening(ctx, rp, addr, 10*time.Second); err != nil {
		return err
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, _ := c.Do(ctx, c.B().Info().Section("replication").Build()).ToString()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("failover: the replica did not sync within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := rp.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(lag):
	}
	fo.primaryBin, fo.primaryArgs = primary.cmd.Path, primary.cmd.Args[1:]
	if _, err := primary.stop(time.Second); err != nil {
		return err
	}
	if err := rp.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	if err := c.Do(ctx, c.B().Arbitrary("REPLICAOF", "NO", "ONE").Build()).Error(); err != nil {
		return fmt.Errorf("failover: promoting the replica: %w", err)
	}
	front.switchTo(addr)
	fmt.Fprintf(r.log, "failover: the primary stopped, the replica on %s (frozen %v while the primary took writes) promoted\n", addr, lag)
	return nil
}

// restore stops the promoted replica and starts the primary again,
// empty, on its own address.
func (fo *failover) restore(r *runner) error {
	if fo.replica == nil {
		return nil
	}
	rp := fo.replica
	fo.replica = nil
	if _, err := rp.stop(time.Second); err != nil {
		return err
	}
	if fo.primaryBin == "" {
		return nil // the primary never stopped
	}
	if err := os.Remove(filepath.Join(r.tmp, "redis", "dump.rdb")); err != nil && !os.IsNotExist(err) {
		return err
	}
	np, err := r.infra.start("redis-server", nil, fo.primaryBin, fo.primaryArgs...)
	if err != nil {
		return err
	}
	fo.primaryBin, fo.primaryArgs = "", nil
	return waitListening(r.ctx, np, r.redis, 10*time.Second)
}
