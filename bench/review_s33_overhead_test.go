package bench

import (
	"math"
	"testing"
	"time"
)

// The overhead load picks a pair's proxy by the slice of the arrival's
// scheduled time, but a record's Start is when it was sent, a little
// later. A request due just before a boundary and sent just after it
// still belongs to the slice whose proxy served it; counted in the next
// slice instead, it is in no slice's ratio while its CPU is.
func TestReviewPairedCapacityCountsALateSendInItsOwnSlice(t *testing.T) {
	const pairs = 4
	var slices []pairSlice
	var recs []Record
	var x, twin time.Duration
	for k := 0; k < 2*pairs; k++ {
		slices = append(slices, pairSlice{x, twin})
		proxy := k % 2
		// 10 requests per slice; in the system's slices the last one, due
		// just before the boundary, is sent 0.2 ms after it (the harness
		// shares the CPU with the proxy under test, so its delays need
		// not be the same in the twin's slices).
		for i := 0; i < 9; i++ {
			recs = append(recs, Record{Proxy: proxy, Status: 200, Start: time.Duration(k)*overheadSlice + time.Duration(i)*time.Millisecond})
		}
		last := time.Duration(k)*overheadSlice + 9*time.Millisecond
		if proxy == 0 {
			last = time.Duration(k+1)*overheadSlice + 200*time.Microsecond
		}
		recs = append(recs, Record{Proxy: proxy, Status: 200, Start: last})
		// The system costs 110 µs per request, the twin 100 µs.
		if proxy == 0 {
			x += 10 * 110 * time.Microsecond
		} else {
			twin += 10 * 100 * time.Microsecond
		}
	}
	slices = append(slices, pairSlice{x, twin}, pairSlice{x, twin})
	s := Summary{Extra: map[string]float64{}}
	pairedCapacity(slices, recs, &s, true)
	// Every slice's own ratio, like the run's, is 100/110.
	for _, key := range []string{"capacity_vs_rr", "slice_ratio_p25", "slice_ratio_p50", "slice_ratio_p75"} {
		if got := s.Extra[key]; math.Abs(got-100.0/110) > 1e-9 {
			t.Errorf("%s %v, want %v", key, got, 100.0/110)
		}
	}
}
