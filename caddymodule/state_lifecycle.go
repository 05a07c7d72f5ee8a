package caddymodule

import (
	"context"
	"sync"

	"github.com/sluice-router/sluice/lb"
)

// lifecycle is what every shared state does alike, policy or flow
// control: from the moment it is built until it is destroyed it follows
// its pool's backend set and runs its background loops (a metrics
// scraper, a log line, a tree trim).
type lifecycle struct {
	unwatch func()
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// begin runs each loop in a goroutine of its own until end, then calls
// watch with the pool's backend set now and again on every change
// (managed: the set was given by set-backends, the admin API or a
// restored file, rather than being empty and unmanaged).
func (l *lifecycle) begin(pool string, watch func(set []lb.Backend, managed bool), loops ...func(context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for _, run := range loops {
		if run == nil {
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			run(ctx)
		}()
	}
	l.unwatch = lb.GetPool(pool).Watch(watch)
}

// end stops following the pool, then stops the loops and waits for them.
func (l *lifecycle) end() {
	l.unwatch()
	l.cancel()
	l.wg.Wait()
}
