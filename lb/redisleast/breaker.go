package redisleast

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// BreakerState is the circuit breaker's position.
type BreakerState int

const (
	// Closed: requests use Redis.
	Closed BreakerState = iota
	// Open: requests use the local fallback; a background probe runs
	// every backoff until Redis answers.
	Open
)

func (b BreakerState) String() string {
	if b == Open {
		return "open"
	}
	return "closed"
}

// breaker fails fast while Redis is unreachable. Requests never probe: a
// probe that hangs would make its request wait, so probing (the half-open
// step) belongs to a background goroutine started when the breaker opens.
type breaker struct {
	mu       sync.Mutex
	failures int // consecutive
	open     bool
	limit    int
	onOpen   func() // starts the probe; called with mu not held
}

func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

func (b *breaker) state() BreakerState {
	if b.isOpen() {
		return Open
	}
	return Closed
}

// record counts one call's result. A timeout opens at once (the caller
// has already waited the longest it should); other transport errors open
// after limit in a row. Redis error replies (a script error, WRONGTYPE)
// prove Redis is reachable, so they count as successes here.
func (b *breaker) record(err error) {
	if err != nil {
		if _, isReply := rueidis.IsRedisErr(err); isReply || rueidis.IsRedisNil(err) {
			err = nil
		}
	}
	b.mu.Lock()
	if err == nil {
		b.failures = 0
		b.mu.Unlock()
		return
	}
	b.failures++
	trip := !b.open && (b.failures >= b.limit || errors.Is(err, context.DeadlineExceeded))
	if trip {
		b.open = true
	}
	b.mu.Unlock()
	if trip && b.onOpen != nil {
		b.onOpen()
	}
}

// forceOpen opens the breaker without starting a probe (the caller does):
// a store that starts while Redis is unreachable.
func (b *breaker) forceOpen() {
	b.mu.Lock()
	b.open = true
	b.mu.Unlock()
}

// close ends an outage; only the probe calls it.
func (b *breaker) close() {
	b.mu.Lock()
	b.open, b.failures = false, 0
	b.mu.Unlock()
}

// backoffSleep waits d or until done closes; false if done closed.
func backoffSleep(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// setLimit changes the failures that open the breaker (Configure).
func (b *breaker) setLimit(n int) {
	b.mu.Lock()
	b.limit = n
	b.mu.Unlock()
}
