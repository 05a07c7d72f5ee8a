package qll

import "testing"

// coldStart is a one-at-a-time server (0.2 s a request) whose first
// request takes 21× that: it compiled, loaded or warmed its caches.
func coldStart() *modelReplica {
	const never = 1 << 30
	return &modelReplica{servers: 1, service: 0.2, stallEvery: never, admitted: never - 1, stall: 4}
}

// runAnsweringAtTheEnd is driver.run for a server that sends its whole
// answer at the end (a diffusion server, a plain completion): each
// request's first byte comes just before it ends, as the proxy reports it.
func (d *driver) runAnsweringAtTheEnd(t *testing.T, n int) {
	t.Helper()
	d.serve(t, n, true)
}

// A one-at-a-time server whose first request was slow must still be
// found one-at-a-time once it serves at its real speed. Its first request
// was the solo baseline, and under load no request ran alone again to
// correct it: every request up to 20 in flight read as unslowed, and it
// was sent 20 at once for good (each waiting inside it for the 19 before
// it, while the edge queue, which gives each request to whichever replica
// frees first, stood empty).
func TestReviewS34AColdFirstRequestDoesNotHideAOneAtATimeReplica(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(d *driver, t *testing.T, n int)
		want int
	}{
		{"first byte at the end", (*driver).runAnsweringAtTheEnd, 1},
		{"no first byte", (*driver).run, 1},
	} {
		d := newDriver(t, map[string]*modelReplica{"diffusion:1": coldStart()})
		tc.run(d, t, 200)
		d.resetWindow()
		tc.run(d, t, 1000)
		if got := d.slots("diffusion:1"); got > tc.want {
			t.Errorf("%s: slots = %d after a slow first request (%d of %d requests sent beside another), want at most %d",
				tc.name, got, d.joined["diffusion:1"], d.dispatched["diffusion:1"], tc.want)
		}
	}
}

// The same cold start on a batching engine (8 at once, no metrics of its
// own) voids its baseline too, and it still grows back to its batch.
func TestReviewS34ABatchingReplicaGrowsBackAfterAColdFirstRequest(t *testing.T) {
	const never = 1 << 30
	m := &modelReplica{servers: 8, service: 1, stallEvery: never, admitted: never - 1, stall: 20}
	d := newDriver(t, map[string]*modelReplica{"llm:1": m})
	d.runAnsweringAtTheEnd(t, 300)
	sum := 0
	for range 50 {
		d.runAnsweringAtTheEnd(t, 20)
		sum += d.slots("llm:1")
	}
	if mean := float64(sum) / 50; mean < 6.5 || mean > 10 {
		t.Fatalf("slots averaged %.1f over 1000 requests after a cold first request, want 6.5..10 (8 at once)", mean)
	}
}
