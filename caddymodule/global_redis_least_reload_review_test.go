package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redisleast"
	"github.com/sluice-router/sluice/lb/redistest"
)

// A reload that lowers global_redis_least's queue_timeout reaches the
// requests already waiting in the global queue (as queued_least_latency's
// does): they used to keep the hour they arrived with.
func TestReloadGlobalRedisLeastQueueTimeoutReachesWaiters(t *testing.T) {
	addr := redistest.Addr(t)
	cctx := provisionContext(t)
	pool := freshPoolName("reload-grl-queue-timeout")
	conf := func(queueTimeout time.Duration) *GlobalRedisLeast {
		return &GlobalRedisLeast{Pool: pool, MaxInflight: 1, QueueTimeout: caddy.Duration(queueTimeout), LeaseTTL: caddy.Duration(time.Hour),
			redisConnection: redisConnection{Redis: []string{addr}, KeyPrefix: fmt.Sprintf("reload-review-%d", time.Now().UnixNano())}}
	}
	first := conf(time.Hour)
	if err := first.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer first.Cleanup()
	st := first.state.picker.(*redisleast.Store)
	st.SetReplicas([]string{"127.0.0.1:20001"})
	held, err := st.Pick(context.Background(), &lb.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(lb.Outcome{Kind: lb.Success})
	out := make(chan error, 1)
	go func() {
		l, err := st.Pick(context.Background(), &lb.Request{})
		if l != nil {
			l.Release(lb.Outcome{Kind: lb.Success})
		}
		out <- err
	}()
	for st.Stats().Waiting == 0 { // no channel says it is queued
		time.Sleep(time.Millisecond)
	}

	next := conf(time.Nanosecond)
	next.KeyPrefix = first.KeyPrefix
	if err := next.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer next.Cleanup()
	if next.state != first.state {
		t.Fatal("the reload did not keep the store")
	}
	guard := time.NewTimer(20 * time.Second) // turns a hang into a failure; no timing asserted
	defer guard.Stop()
	select {
	case err := <-out:
		if !errors.Is(err, lb.ErrQueueTimeout) {
			t.Fatalf("the waiter after queue_timeout 1h → 1ns: %v, want a queue timeout", err)
		}
	case <-guard.C:
		t.Fatal("the waiter still waits 20s after a reload to queue_timeout 1ns: the old 1h is in force")
	}
}
