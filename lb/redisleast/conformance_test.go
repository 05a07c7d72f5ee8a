package redisleast

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/lbtest"
	"github.com/sluice-router/sluice/lb/redistest"
)

func TestConformance(t *testing.T) { redistest.Each(t, testConformance) }

func testConformance(t *testing.T, tg redistest.Target) {
	lbtest.Run(t, lbtest.Subject{
		New: func(t *testing.T) lb.Picker { return newStore(t, confFor(t, tg), "conformance") },
		Reconfigure: func(t *testing.T, p lb.Picker) {
			c := p.(*Store).Config()
			c.MaxInflight, c.LeaseTTL, c.BreakerFailures = 100, 3*time.Second, 7
			if err := p.(*Store).Configure(c); err != nil {
				t.Fatal(err)
			}
		},
		Applied: func(p lb.Picker) bool {
			c := p.(*Store).Config()
			return c.MaxInflight == 100 && c.LeaseTTL == 3*time.Second && c.BreakerFailures == 7
		},
	})
}

// A reload of max_inflight 1 → 100 stops the shedding at once (it used
// to keep shedding at 1: the store was reused with its old settings).
func TestConfigureChangesSheddingLive(t *testing.T) {
	cfg := testConfig(t, testRedis(t))
	cfg.MaxInflight = 1
	s := newStore(t, cfg, "live")
	s.SetReplicas([]string{"10.0.0.1:1"})
	ctx := context.Background()
	first, err := s.Pick(ctx, &lb.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pick(ctx, &lb.Request{}); !errors.Is(err, lb.ErrSaturated) {
		t.Fatalf("second pick at max_inflight 1: %v, want ErrSaturated", err)
	}
	cfg.MaxInflight = 100
	if err := s.Configure(cfg); err != nil {
		t.Fatal(err)
	}
	second, err := s.Pick(ctx, &lb.Request{})
	if err != nil {
		t.Fatalf("after Configure(max_inflight 100): %v", err)
	}
	first.Release(lb.Outcome{Kind: lb.Success})
	second.Release(lb.Outcome{Kind: lb.Success})

	other := cfg
	other.KeyPrefix += "-other"
	if err := s.Configure(other); err == nil {
		t.Fatal("Configure accepted a connection setting (key_prefix) that needs a new store")
	}
	if cfg.ConnectionKey() == other.ConnectionKey() {
		t.Fatal("key_prefix must be part of the connection key")
	}
	withPassword := cfg
	withPassword.Password = "hunter2"
	if k := withPassword.ConnectionKey(); k == cfg.ConnectionKey() || strings.Contains(k, "hunter2") {
		t.Fatalf("connection key %q: must differ by password and never hold it", k)
	}
}
