package bench

import (
	"testing"
	"time"
)

// pairedCapacity reads slice k as the system's for even k and the twin's
// for odd k, between the samples at its two boundaries; the run's total
// goes from the first sample to the last (after every answer).
func TestPairedCapacityPairsEachSystemSliceWithTheTwinsNext(t *testing.T) {
	const pairs = 5
	// The system costs 110 µs per request, the twin 100 µs; 10 requests
	// per slice. Each proxy also spends 5 µs of idle CPU per other slice.
	var slices []pairSlice
	var recs []Record
	var x, twin time.Duration
	for k := 0; k < 2*pairs; k++ {
		slices = append(slices, pairSlice{x, twin})
		proxy := k % 2
		for i := 0; i < 10; i++ {
			recs = append(recs, Record{Proxy: proxy, Status: 200, Start: time.Duration(k)*overheadSlice + time.Duration(i)*time.Millisecond})
		}
		if proxy == 0 {
			x += 10 * 110 * time.Microsecond
			twin += 5 * time.Microsecond
		} else {
			twin += 10 * 100 * time.Microsecond
			x += 5 * time.Microsecond
		}
	}
	slices = append(slices, pairSlice{x, twin}) // the last boundary
	slices = append(slices, pairSlice{x, twin}) // after every answer
	s := Summary{Extra: map[string]float64{}}
	pairedCapacity(slices, recs, &s, true)
	want := (float64(pairs*10*100+pairs*5) / (pairs * 10)) / (float64(pairs*10*110+pairs*5) / (pairs * 10))
	if got := s.Extra["capacity_vs_rr"]; got < want-1e-9 || got > want+1e-9 {
		t.Fatalf("capacity vs RR %v, want %v", got, want)
	}
	if got := s.Extra["slice_ratio_p50"]; got < 100.0/110-1e-9 || got > 100.0/110+1e-9 {
		t.Fatalf("slice ratio p50 %v, want %v (each pair's own ratio)", got, 100.0/110)
	}
}

// Interleaved (overhead-interleaved), both proxies take requests in every
// slice: capacity still comes from the run's totals, and no slice ratio
// is made of slices that were not one proxy's.
func TestInterleavedCapacityUsesTheRunsTotalsOnly(t *testing.T) {
	var recs []Record
	for i := 0; i < 40; i++ {
		recs = append(recs, Record{Proxy: i % 2, Status: 200, Start: time.Duration(i) * 100 * time.Millisecond})
	}
	// 20 requests each over the run: the system spent 20 × 120 µs, the
	// twin 20 × 100 µs.
	// Sampled at 9 slice boundaries (both proxies busy in each), then
	// after every answer.
	slices := make([]pairSlice, 10)
	for k := range 9 {
		slices[k] = pairSlice{time.Duration(k) * 20 * 120 * time.Microsecond / 8, time.Duration(k) * 20 * 100 * time.Microsecond / 8}
	}
	slices[9] = slices[8]
	s := Summary{Extra: map[string]float64{}}
	pairedCapacity(slices, recs, &s, false)
	if got, want := s.Extra["capacity_vs_rr"], 100.0/120; got < want-1e-9 || got > want+1e-9 {
		t.Fatalf("capacity vs RR %v, want %v", got, want)
	}
	if _, ok := s.Extra["slice_ratio_p50"]; ok {
		t.Fatalf("slice ratios %v for interleaved slices", s.Extra)
	}
}
