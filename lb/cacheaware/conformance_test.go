package cacheaware

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/lbtest"
	"github.com/sluice-router/sluice/lb/tracker"
)

// The defaults, with a short down time so churn's failures recover
// quickly, and the eviction loop running as in production.
func TestConformance(t *testing.T) {
	tc := tracker.Config{FailDuration: time.Millisecond}
	lbtest.Run(t, lbtest.Subject{
		New: func(t *testing.T) lb.Picker {
			p := NewPicker(Config{}, tc)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { p.Run(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })
			return p
		},
		Reconfigure: func(t *testing.T, p lb.Picker) {
			c := tc
			c.MaxFails = 4
			p.(*Picker).Configure(Config{CacheThreshold: 0.75, MaxTreeSize: 1000, EvictionInterval: time.Millisecond}, c)
		},
		Applied: func(p lb.Picker) bool {
			s := p.(*Picker).Settings().(PickerSettings)
			return s.Router.CacheThreshold == 0.75 && s.Router.MaxTreeSize == 1000 &&
				s.Router.EvictionInterval == time.Millisecond && s.Tracker.MaxFails == 4
		},
	})
}
