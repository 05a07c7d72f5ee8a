package redisleast

import (
	"testing"

	"github.com/sluice-router/sluice/lb/lbtest"
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
				lbtest.SetSwap(t, newStore(t, c.cfg, "swap"), 500)
			})
		}
	})
}
