package modelmetrics

import (
	"sync"
	"testing"
)

// A reload that changes the path re-targets the scraper; a SetTargets
// running at the same time (the backend set changing under load) must
// not be undone by it: the scraper ends on the set given last, at the
// new path. (Configure read the set, let go of the lock, and set the old
// set again: a replica removed meanwhile was scraped again and one added
// meanwhile never, until the next change of the set.)
func TestConfigureDoesNotUndoAConcurrentSetTargets(t *testing.T) {
	lost := 0
	for i := 0; i < 20000 && lost == 0; i++ {
		s := New(Config{})
		s.SetTargets(map[string]string{"old:1": "old:1"})
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; s.Configure(Config{Path: "/other"}) })
		wg.Go(func() { <-start; s.SetTargets(map[string]string{"new:1": "new:1"}) })
		close(start)
		wg.Wait()
		got := *s.targets.Load()
		if _, ok := got["new:1"]; !ok || len(got) != 1 {
			lost++
			keys := []string{}
			for a, tg := range got {
				keys = append(keys, a+"="+tg.url)
			}
			t.Errorf("round %d: targets %v after SetTargets(new:1) and a Configure, want only new:1", i, keys)
		}
		if tg := got["new:1"]; tg != nil && tg.url != "http://new:1/other" {
			t.Errorf("round %d: new:1 scraped at %s, want the new path", i, tg.url)
		}
	}
}
