package redisleast

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/redistest"
)

// The conformance suite's set swap (lbtest) runs the default mode, the
// batched one; the exact picks (one select script each) and the global
// queue read the member set through other code: while set-backends
// swaps the whole set back and forth, none of their picks is refused
// either (a pick whose candidates Redis no longer has picks again from
// the set in force).
func TestPicksDuringAWholeSetSwapInEveryMode(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		exact := confFor(t, tg)
		exact.CallRate = -1 // unlimited: one script per pick
		queue := queueConfFor(t, tg)
		for _, c := range []struct {
			name string
			cfg  Config
		}{{"exact", exact}, {"queue", queue}} {
			t.Run(c.name, func(t *testing.T) {
				s := newStore(t, c.cfg, "swap")
				sets := [][]string{{"a:1", "b:1"}, {"c:1", "d:1"}}
				s.SetReplicas(sets[0])
				stop, done := make(chan struct{}), make(chan struct{})
				go func() {
					defer close(done)
					for i := 1; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						s.SetReplicas(sets[i%2])
					}
				}()
				refused := map[string]int{}
				for range 500 {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					l, err := s.Pick(ctx, &lb.Request{})
					cancel()
					if err != nil {
						refused[err.Error()]++
						continue
					}
					l.Release(ok)
				}
				close(stop)
				<-done
				if len(refused) > 0 {
					t.Errorf("picks refused while the set was swapped (never empty): %v", refused)
				}
				if n := s.InFlight(); len(n) != 0 {
					t.Errorf("in flight %v after every release", n)
				}
			})
		}
	})
}
