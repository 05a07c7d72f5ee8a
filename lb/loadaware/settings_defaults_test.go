package loadaware

import (
	"testing"

	"github.com/sluice-router/sluice/lb/tracker"
)

// What Config shows (health's settings) is what the picker runs with:
// the tracker's defaults included, which tracker.New fills on its own.
func TestConfigShowsTheTrackerDefaultsItRunsWith(t *testing.T) {
	p := NewPicker(PickerConfig{})
	if got, runs := p.Config().Tracker, p.Tracker().Config(); got != runs {
		t.Errorf("new picker shows tracker %+v, runs with %+v", got, runs)
	}
	if err := p.Configure(PickerConfig{Tracker: tracker.Config{MaxFails: 3}}); err != nil {
		t.Fatal(err)
	}
	if got, runs := p.Config().Tracker, p.Tracker().Config(); got != runs {
		t.Errorf("reconfigured picker shows tracker %+v, runs with %+v", got, runs)
	}
}
