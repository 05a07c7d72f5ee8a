package qll

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/lbtest"
)

// The defaults (one request at a time per replica, so the queue is used),
// with a short down time so churn's failures recover quickly.
func TestConformance(t *testing.T) {
	cfg := Config{FailDuration: time.Millisecond, QueueTimeout: time.Second}
	lbtest.Run(t, lbtest.Subject{
		New: func(t *testing.T) lb.Picker {
			s := New(cfg)
			t.Cleanup(s.Close)
			return s
		},
		Reconfigure: func(t *testing.T, p lb.Picker) {
			c := cfg
			c.Parallelism = 4
			c.LatencyThreshold = 7 * time.Second
			p.(*State).Configure(c)
		},
		Applied: func(p lb.Picker) bool {
			c := p.(*State).Config()
			return c.Parallelism == 4 && c.LatencyThreshold == 7*time.Second
		},
	})
}

// With batching replicas the queue is rarely used: the suite again.
func TestConformanceBatching(t *testing.T) {
	cfg := Config{Parallelism: 8, FailDuration: time.Millisecond, QueueTimeout: time.Second}
	lbtest.Run(t, lbtest.Subject{
		New: func(t *testing.T) lb.Picker {
			s := New(cfg)
			t.Cleanup(s.Close)
			return s
		},
	})
}
