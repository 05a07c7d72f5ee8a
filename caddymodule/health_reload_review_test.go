package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// reloadedHealthModule builds a policy on a pool with the given passive
// health; provisioned twice on one pool, it is a reload (state kept).
type reloadedHealthModule struct {
	name  string
	build func(t *testing.T, pool string, h passiveHealth) interface {
		caddy.Provisioner
		caddy.CleanerUpper
	}
}

func healthReloadModules(t *testing.T) []reloadedHealthModule {
	mods := []reloadedHealthModule{
		{"load_aware", func(_ *testing.T, pool string, h passiveHealth) interface {
			caddy.Provisioner
			caddy.CleanerUpper
		} {
			return &LoadAware{Pool: pool, passiveHealth: h}
		}},
		{"cache_aware", func(_ *testing.T, pool string, h passiveHealth) interface {
			caddy.Provisioner
			caddy.CleanerUpper
		} {
			return &CacheAware{Pool: pool, passiveHealth: h}
		}},
	}
	if addr := redistest.Addr(t); addr != "" {
		prefix := fmt.Sprintf("reload-review-%d", time.Now().UnixNano())
		mods = append(mods, reloadedHealthModule{"global_redis_least", func(_ *testing.T, pool string, h passiveHealth) interface {
			caddy.Provisioner
			caddy.CleanerUpper
		} {
			return &GlobalRedisLeast{Pool: pool, redisConnection: redisConnection{Redis: []string{addr}, KeyPrefix: prefix},
				LeaseTTL: caddy.Duration(time.Hour), passiveHealth: h}
		}})
	}
	return mods
}

// stateOf is the shared state a provisioned policy took.
func stateOf(m caddy.Provisioner) *policyState {
	switch p := m.(type) {
	case *LoadAware:
		return p.state
	case *CacheAware:
		return p.state
	case *GlobalRedisLeast:
		return p.state
	}
	panic(fmt.Sprintf("%T", m))
}

// A reload that changes max_fails or fail_duration applies to a replica
// failures already marked down, as queued_least_latency's does. One
// failure under max_fails 1 kept the replica out (ErrAllDown) after a
// reload to max_fails 3, which one failure does not reach; and for the
// whole of an old fail_duration of an hour after a reload to 1ns.
func TestReloadPassiveHealthReachesAReplicaAlreadyDown(t *testing.T) {
	cctx := provisionContext(t)
	for _, mod := range healthReloadModules(t) {
		for _, c := range []struct {
			what        string
			before, now passiveHealth
		}{
			{"max_fails 1 → 3", passiveHealth{MaxFails: 1}, passiveHealth{MaxFails: 3}},
			{"fail_duration 1h → 1ns", passiveHealth{FailDuration: caddy.Duration(time.Hour)}, passiveHealth{FailDuration: 1}},
		} {
			t.Run(mod.name+"/"+c.what, func(t *testing.T) {
				pool := freshPoolName("reload-health-" + mod.name)
				const dial = "127.0.0.1:20001"
				first := mod.build(t, pool, c.before)
				if err := first.Provision(cctx); err != nil {
					t.Fatal(err)
				}
				defer first.Cleanup()
				pk := stateOf(first).picker
				pk.SetReplicas([]string{dial})
				l, err := pk.Pick(context.Background(), &lb.Request{})
				if err != nil {
					t.Fatal(err)
				}
				l.Release(lb.Outcome{Kind: lb.Failure})
				if _, err := pk.Pick(context.Background(), &lb.Request{}); !errors.Is(err, lb.ErrAllDown) {
					t.Fatalf("after one failure under %+v: %v, want the replica down", c.before, err)
				}

				next := mod.build(t, pool, c.now)
				if err := next.Provision(cctx); err != nil {
					t.Fatal(err)
				}
				defer next.Cleanup()
				if stateOf(next) != stateOf(first) {
					t.Fatal("the reload did not keep the state")
				}
				l, err = pk.Pick(context.Background(), &lb.Request{})
				if err != nil {
					t.Fatalf("after the reload %s, one failure ago: %v; the old setting is in force", c.what, err)
				}
				l.Release(lb.Outcome{Kind: lb.Success})
			})
		}
	}
}
