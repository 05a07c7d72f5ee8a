package loadaware

import "testing"

// Only no_hit_lru routes on the prompt's text: with the default scorers a
// pick needs the request's counts alone (the adapter then spares the
// text's copy), and a reload that turns it on (the heimdall preset) is
// read at once.
func TestOnlyNoHitLRUReadsTheText(t *testing.T) {
	pk := NewPicker(PickerConfig{})
	if pk.ReadsText() {
		t.Fatal("the default scorers read the text")
	}
	if err := pk.Configure(PickerConfig{Policy: Config{Weights: HeimdallWeights()}}); err != nil {
		t.Fatal(err)
	}
	if !pk.ReadsText() {
		t.Fatal("no_hit_lru, configured, does not read the text")
	}
	if err := pk.Configure(PickerConfig{Policy: Config{Weights: map[string]float64{NoHitLRU: 0, ActiveRequest: 1}}}); err != nil {
		t.Fatal(err)
	}
	if pk.ReadsText() {
		t.Fatal("no_hit_lru weighted 0 reads the text")
	}
}
