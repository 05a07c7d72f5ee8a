package redisleast

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// BenchmarkSelectRelease measures one select plus one release against a
// loopback Redis, at 1, 8 and 64 concurrent callers (RunParallel starts
// SetParallelism × GOMAXPROCS goroutines, so 1 runs a plain loop).
func BenchmarkSelectRelease(b *testing.B) {
	addr := testRedis(b)
	reps := make([]string, 16)
	for i := range reps {
		reps[i] = fmt.Sprintf("10.0.0.%d:8000", i)
	}
	for _, conc := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			s := newStore(b, testConfig(b, addr), "bench")
			if err := s.Sync(context.Background(), reps); err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			var lat []time.Duration
			ok := lb.Outcome{Kind: lb.Success}
			run := func(next func() bool) {
				var mine []time.Duration
				for next() {
					t0 := time.Now()
					l, err := s.Select(context.Background(), reps)
					if err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(t0))
					l.Release(ok)
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}
			b.ResetTimer()
			start := time.Now()
			if conc == 1 {
				i := 0
				run(func() bool { i++; return i <= b.N })
			} else {
				b.SetParallelism(max(1, conc/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) { run(pb.Next) })
			}
			elapsed := time.Since(start)
			b.StopTimer()
			if st := s.Stats(); st.Fallbacks != 0 {
				b.Fatalf("%d fallbacks during the benchmark", st.Fallbacks)
			}
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "select-p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "select-p99-µs")
			}
		})
	}
}
