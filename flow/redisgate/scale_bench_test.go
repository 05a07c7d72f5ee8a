package redisgate

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// BenchmarkClaimsAtScale measures what sharing one pool costs Redis when
// it is saturated: 8 instances, 64 tenants, twice the pool's capacity in
// requests at all times (each held 20 ms), on a private redis-server so
// that its CPU is the gate's alone. Reported: claims/s over all instances,
// Redis CPU in cores (used_cpu_user+sys over wall time), served req/s.
// It fails if more than the capacity ran at once.
//
//	go test -run XXX -bench ClaimsAtScale -benchtime 3000x ./flow/redisgate/
func BenchmarkClaimsAtScale(b *testing.B) {
	for _, instances := range []int{8, 16} {
		b.Run(fmt.Sprintf("instances=%d", instances), func(b *testing.B) { claimsAtScale(b, instances) })
	}
}

func claimsAtScale(b *testing.B, instances int) {
	const tenants, capacity = 64, 64
	const hold = 20 * time.Millisecond
	srv, err := redistest.Start("")
	if err != nil {
		b.Skip("needs redis-server on PATH: ", err)
	}
	b.Cleanup(srv.Kill)
	conn := redisconn.Config{Addrs: []string{srv.Addr}}
	cl := redistest.Client(b, conn)
	pool := fmt.Sprintf("scale%d", time.Now().UnixNano()%1e9)
	var ins []*instance
	for i := range instances {
		ins = append(ins, newInstance(b, conn, pool, fmt.Sprintf("i%d", i), capacity, nil))
	}
	var inFlight, peak, served atomic.Int64
	var left atomic.Int64
	left.Store(int64(b.N))
	cpu0 := redisCPU(b, cl)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 2 * capacity {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := ins[w%instances]
			for n := 0; left.Add(-1) >= 0; n++ {
				tenant := fmt.Sprintf("tenant-%d", (w+n*2*capacity)%tenants)
				tk, err := in.ctl.Enqueue(context.Background(), flow.Request{FlowID: tenant})
				if err != nil {
					b.Error(err)
					return
				}
				c := inFlight.Add(1)
				for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
				}
				time.Sleep(hold)
				inFlight.Add(-1)
				served.Add(1)
				tk.Release()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	cpu := redisCPU(b, cl) - cpu0
	var claims uint64
	for _, in := range ins {
		claims += in.gate.Stats().Claims
	}
	if p := peak.Load(); p > capacity {
		b.Fatalf("%d requests in flight at once; the pool holds %d", p, capacity)
	}
	b.ReportMetric(float64(claims)/elapsed.Seconds(), "claims/s")
	b.ReportMetric(cpu/elapsed.Seconds(), "redis-cores")
	b.ReportMetric(float64(served.Load())/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(peak.Load()), "peak-in-flight")
}

// redisCPU is the CPU seconds (user + system) the server has used.
func redisCPU(b *testing.B, cl rueidis.Client) float64 {
	info, err := cl.Do(context.Background(), cl.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		}
	}
	return total
}
