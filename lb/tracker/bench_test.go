package tracker

import (
	"fmt"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// BenchmarkAcquireReleaseParallel is the tracker's share of each request
// on a lightly loaded pool, from many goroutines at once: a lease on one
// of 4 replicas and its release, which often takes the replica's count
// back to 0.
//
//	go test -run '^$' -bench AcquireReleaseParallel -benchmem ./lb/tracker/
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	t := New(Config{})
	addrs := make([]string, 4)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", 9000+i)
	}
	t.SetReplicas(addrs)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			l := t.Acquire(addrs[i%len(addrs)])
			i++
			if l == nil {
				b.Fatal("no lease on a present replica")
			}
			l.Release(lb.Outcome{Kind: lb.Success})
		}
	})
}
