package qll

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/lbtest"
)

func TestConformance(t *testing.T) {
	cfg := Config{Parallelism: 8, FailDuration: time.Millisecond, QueueTimeout: time.Second}
	lbtest.Run(t, lbtest.Subject{
		New: func(t *testing.T) lb.Picker {
			s := New(cfg)
			t.Cleanup(s.Close)
			return s
		},
		Reconfigure: func(t *testing.T, p lb.Picker) {
			c := cfg
			c.Parallelism = 9
			p.(*State).Configure(c)
		},
		Applied: func(p lb.Picker) bool { return p.(*State).Config().Parallelism == 9 },
	})
}
