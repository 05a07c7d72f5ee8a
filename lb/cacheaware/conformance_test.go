package cacheaware

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/lbtest"
	"github.com/sluice-router/sluice/lb/tracker"
)

func TestConformance(t *testing.T) {
	tc := tracker.Config{FailDuration: time.Millisecond}
	lbtest.Run(t, lbtest.Subject{
		New: func(t *testing.T) lb.Picker { return NewPicker(Config{}, tc) },
		Reconfigure: func(t *testing.T, p lb.Picker) {
			p.(*Picker).Configure(Config{CacheThreshold: 0.75, MaxTreeSize: 1000}, tc)
		},
		Applied: func(p lb.Picker) bool {
			c := p.(*Picker).Router().Config()
			return c.CacheThreshold == 0.75 && c.MaxTreeSize == 1000
		},
	})
}
