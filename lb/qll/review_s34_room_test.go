package qll

import "testing"

// A replica whose own metrics say nothing waits in it has room, whatever
// its latency does: when the machine the proxy and the replicas share
// slows every request alike (other processes, a CPU-starved host), the
// learned limit read each request's latency against a solo baseline from
// before, took the replica for full and held requests at the edge while
// the engine reported an empty queue. (Measured: four instant simulated
// replicas at 2000 req/s on a 2-core box with two busy loops beside
// them: queued_least_latency answered 36% of the requests 503
// queue_evicted at 3-7 learned slots a replica, while round robin served
// 85% of them.)
func TestReviewS34AnEngineSayingRoomIsNotCutWhenTheMachineSlows(t *testing.T) {
	m := &modelReplica{servers: 256, service: 0.01, stallEvery: 1 << 30}
	d := newDriver(t, map[string]*modelReplica{"a": m})
	roomSaid := func() { d.s.engineSample("a", engineSays(0, 0, 0.01)) }
	for range 20 {
		roomSaid()
		d.run(t, 20)
	}
	before := d.slots("a")
	m.service *= 20 // the whole machine slows, every request alike
	lowest := before
	for range 40 {
		roomSaid()
		d.run(t, 20)
		lowest = min(lowest, d.slots("a"))
	}
	if lowest < before {
		t.Fatalf("slots fell from %d to %d while every sample of the engine said nothing waits in it", before, lowest)
	}
}

// A limit that failed just above where it is (a cut while no sample was
// at hand: the engine's metrics late, or not read yet) probes one more
// request per few hundred at the limit. Once the engine's samples say
// nothing waits in it, that failure is void: it grows by one per request
// served at the limit again.
func TestReviewS34AFailureTheEngineContradictsIsNotProbedSlowly(t *testing.T) {
	c := newConcurrencyLimit()
	for range 5 {
		c.observe(plainKind, 1, 0.01, 0.01, 0, false) // its solo time, before the machine slowed
	}
	c.limit, c.growing, c.failedAt, c.failures = 10, false, 11, 3
	for range 100 {
		c.observe(plainKind, c.slots(), 0.2, 0.2, 0, true)
	}
	if got := c.slots(); got < 50 {
		t.Fatalf("limit %d after 100 requests served at the limit while the engine said it has room (failed at 11 before), want 50 or more", got)
	}
}
