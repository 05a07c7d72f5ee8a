package lb

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// A watcher subscribed while sets are being given, concurrently, sees a
// run of sets that ends with the pool's own: none missed at the end, none
// older delivered after a newer one.
func TestAWatcherEndsOnThePoolsSetUnderConcurrentSets(t *testing.T) {
	p := GetPool("review-s33-watch")
	v0 := p.Version() // under -count 2 the pool is the first run's
	var wg sync.WaitGroup
	var mu sync.Mutex
	var seen [][]string
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bs, _ := ParseBackends([]string{fmt.Sprintf("http://10.0.0.%d:80", i+1)})
			p.Set(bs)
		}()
		if i == 8 {
			cancel := p.Watch(func(set []Backend, _ bool) {
				mu.Lock()
				seen = append(seen, Dials(set))
				mu.Unlock()
			})
			defer cancel()
		}
	}
	wg.Wait()
	set, _ := p.Backends()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || !slices.Equal(seen[len(seen)-1], Dials(set)) {
		t.Fatalf("the watcher saw %v last, the pool holds %v", seen, Dials(set))
	}
	if v := p.Version(); v != v0+16 {
		t.Fatalf("version %d after 16 sets from %d", v, v0)
	}
}
