package loadaware

import (
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/lbtest"
	"github.com/sluice-router/sluice/lb/modelmetrics"
	"github.com/sluice-router/sluice/lb/tracker"
)

func TestConformance(t *testing.T) {
	cfg := PickerConfig{Tracker: tracker.Config{FailDuration: time.Millisecond}}
	lbtest.Run(t, lbtest.Subject{
		New: func(t *testing.T) lb.Picker { return NewPicker(cfg) },
		Reconfigure: func(t *testing.T, p lb.Picker) {
			c := cfg
			c.Policy.Threshold = 64
			c.Metrics = modelmetrics.Config{Interval: 3 * time.Second, Path: "/m"}
			c.PrefixIndexSize = 1000
			if err := p.(*Picker).Configure(c); err != nil {
				t.Fatal(err)
			}
		},
		Applied: func(p lb.Picker) bool {
			pk := p.(*Picker)
			sc := pk.Scraper().Config()
			return pk.Policy().Config().Threshold == 64 && sc.Interval == 3*time.Second && sc.Path == "/m" &&
				pk.Config().PrefixIndexSize == 1000
		},
	})
}
