package flow

import (
	"context"
	"errors"
	"math"
	"testing"
)

// A client's Content-Length can be anything up to math.MaxInt64. A body
// that large must be refused, not admitted because queued bytes + its
// size wrapped around below the limit; and it must not leave the band's
// byte count negative, which would let every later request past
// max_bytes.
func TestHugeBodyCannotWrapTheByteLimits(t *testing.T) {
	for name, cfg := range map[string]Config{
		"band":   {Bands: []BandConfig{{Priority: 0, MaxBytes: 100}}},
		"global": {MaxBytes: 100, Bands: []BandConfig{{Priority: 0, MaxBytes: math.MaxInt64}}},
	} {
		c := newController(t, cfg, closedGate())
		out := make(chan result, 4)
		enqueueAsync(ctx2(t), c, Request{Bytes: 1}, out)
		waitQueued(t, c, 1)
		enqueueAsync(ctx2(t), c, Request{Bytes: math.MaxInt64}, out)
		eventually(t, "the huge request's answer or its queueing", func() bool { return len(out) > 0 || c.Snapshot().Queued > 1 })
		s := c.Snapshot()
		if s.Queued != 1 || s.Bytes != 1 {
			t.Fatalf("%s max_bytes: a request of MaxInt64 bytes was queued: queued %d, bytes %d (want 1, 1)", name, s.Queued, s.Bytes)
		}
		if r := <-out; !errors.Is(r.err, ErrCapacity) {
			t.Fatalf("%s max_bytes: huge request: %v, want ErrCapacity", name, r.err)
		}
		// Nor may it push out a request of a larger flow to take its
		// place (that check wrapped the same way).
		enqueueAsync(ctx2(t), c, Request{Bytes: 1}, out)
		waitQueued(t, c, 2)
		enqueueAsync(ctx2(t), c, Request{FlowID: "x", Bytes: math.MaxInt64}, out)
		if r := <-out; r.req.FlowID != "x" || !errors.Is(r.err, ErrCapacity) {
			t.Fatalf("%s max_bytes: first answer: flow %q, %v; want the huge request of flow x refused", name, r.req.FlowID, r.err)
		}
		if s := c.Snapshot(); s.Queued != 2 || s.Bytes != 2 || s.Counters.RejectedCapacity != 2 {
			t.Fatalf("%s max_bytes: after the push-out attempt: queued %d, bytes %d, rejected %d (want 2, 2, 2)",
				name, s.Queued, s.Bytes, s.Counters.RejectedCapacity)
		}
	}
}

// Priorities are any int the config names: bands far apart must still be
// served highest first (their difference overflows an int).
func TestExtremePrioritiesKeepTheirOrder(t *testing.T) {
	c := newController(t, Config{Bands: []BandConfig{{Priority: math.MaxInt}, {Priority: math.MinInt}}}, slots(1))
	held, err := c.Enqueue(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 2)
	enqueueAsync(context.Background(), c, Request{Priority: math.MinInt}, out)
	waitQueued(t, c, 1)
	enqueueAsync(context.Background(), c, Request{Priority: math.MaxInt}, out)
	waitQueued(t, c, 2)
	held.Release()
	r := <-out
	if r.req.Priority != math.MaxInt {
		t.Fatalf("first served: priority %d, want %d (bands in order %v)", r.req.Priority, math.MaxInt, bandOrder(c))
	}
	r.ticket.Release()
	(<-out).ticket.Release()
}

func bandOrder(c *Controller) []int {
	var ps []int
	for _, b := range c.Snapshot().Bands {
		ps = append(ps, b.Priority)
	}
	return ps
}

// max_concurrency, max_token_concurrency and replicas are any int64/int
// the config names ("unlimited" written as a huge number): the pool's
// limit must stay a positive count, not wrap negative (a global gate
// would then grant nothing and hold every request until its TTL) or to a
// small number (the band queues are sized from it).
func TestHugeConcurrencyLimitsDoNotWrap(t *testing.T) {
	cases := []struct {
		perReplica int64
		replicas   int
	}{
		{math.MaxInt64, 1},     // int64(float64(MaxInt64)) is out of range
		{1 << 62, 4},           // wraps to 0
		{1<<62 + 1<<11, 4},     // wraps to a small positive
		{1 << 40, math.MaxInt}, // huge replica count
		{100, 3},               // sanity
	}
	for _, tc := range cases {
		for _, mode := range []string{ModeRequests, ModeTokens} {
			d := NewConcurrencyDetector(DetectorConfig{MaxConcurrency: tc.perReplica, MaxTokenConcurrency: tc.perReplica, ConcurrencyMode: mode},
				func() int { return tc.replicas })
			want := min(float64(tc.perReplica)*float64(tc.replicas), maxPoolLimit)
			if got, _ := d.PoolLimit(); float64(got) != want {
				t.Errorf("%s: %d per replica × %d replicas: pool limit %d, want %.0f", mode, tc.perReplica, tc.replicas, got, want)
			}
			if c := d.Saturation(InFlight{}).Capacity; mode == ModeRequests && float64(c) != want {
				t.Errorf("%s: %d per replica × %d replicas: capacity %d, want %.0f", mode, tc.perReplica, tc.replicas, c, want)
			}
		}
	}
}

// ctx2 is a context cancelled when the test ends, so requests left
// queued then give up.
func ctx2(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
