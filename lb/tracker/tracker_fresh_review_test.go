package tracker

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// A probe that fails marks its replica down again before it leaves the
// in-flight count (Release stores the new down time, then decrements).
// A pick that read the old, passed down time just before must not take
// the slot the failed probe frees: the replica is down again, and a
// second request would go straight to a replica that has just failed.
// The interleaving is forced: the pick's clock read (between its read of
// the down time and its count) waits until the failed probe is out of
// the count.
func TestAcquireUsableSeesTheDownTimeOfAProbeThatJustFailed(t *testing.T) {
	tr := New(Config{FailDuration: 10 * time.Second})
	at := time.Unix(100, 0)
	tr.now = func() time.Time { return at }
	tr.SetReplicas([]string{"a:1"})
	tr.Acquire("a:1").Release(lb.Outcome{Kind: lb.Failure}) // down until 110s
	at = time.Unix(111, 0)
	probe := tr.AcquireUsable("a:1", 1)
	if probe == nil {
		t.Fatal("no probe once the down time was over")
	}
	r := tr.reps["a:1"]

	var hooked atomic.Bool
	released := make(chan struct{})
	tr.now = func() time.Time {
		if hooked.CompareAndSwap(false, true) {
			// The pick's clock read: the probe fails now, and is out of
			// the count (its last step, the removal, waits for the pick's
			// read lock) before the pick goes on.
			go func() {
				defer close(released)
				probe.Release(lb.Outcome{Kind: lb.Failure})
			}()
			for r.inFlight.Load() != 0 {
				runtime.Gosched()
			}
		}
		return at
	}
	second := tr.AcquireUsable("a:1", 5)
	if !hooked.Load() { // the pick did not read the clock: fail the probe now
		hooked.Store(true)
		go func() {
			defer close(released)
			probe.Release(lb.Outcome{Kind: lb.Failure})
		}()
	}
	<-released
	if second != nil {
		second.Release(lb.Outcome{Kind: lb.Cancelled})
		t.Fatalf("a pick took a:1 right after its probe failed (down until %v, now %v)",
			time.Unix(0, r.downUntil.Load()), at)
	}
	if n, c := r.inFlight.Load(), r.inFlightCost.Load(); n != 0 || c != 0 {
		t.Fatalf("in flight %d, cost %d after every release; want 0, 0", n, c)
	}
	if _, usable := tr.Load("a:1"); usable {
		t.Fatal("a replica whose probe failed is usable")
	}
}
