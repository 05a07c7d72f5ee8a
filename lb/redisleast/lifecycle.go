package redisleast

import (
	"sync"
	"sync/atomic"
)

// lifecycle is a store's goroutines and its closing: the maintenance
// loop, the probe and the mode's goroutines run on wg until done closes;
// life orders starting one of them (or a queued wait) against Close.
type lifecycle struct {
	life    sync.Mutex
	probing atomic.Bool // the probe runs (one per outage)
	closed  atomic.Bool
	done    chan struct{}
	wg      sync.WaitGroup
}

// hold adds one to wg, unless the store is closing (false): close waits
// for wg after it marked the store closed, so nothing is added too late.
func (l *lifecycle) hold(wg *sync.WaitGroup) bool {
	l.life.Lock()
	defer l.life.Unlock()
	if l.closed.Load() {
		return false
	}
	wg.Add(1)
	return true
}

// shut marks the store closed and stops its goroutines' loops; false if
// it was closed already.
func (l *lifecycle) shut() bool {
	l.life.Lock()
	if !l.closed.CompareAndSwap(false, true) {
		l.life.Unlock()
		return false
	}
	l.life.Unlock()
	close(l.done)
	return true
}
