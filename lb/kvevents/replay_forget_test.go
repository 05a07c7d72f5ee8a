package kvevents

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// A replica removed from the pool (Forget, its pod no longer resolved)
// while a replay holds its topic's messages stays out of the index: the
// messages held from before the removal are not applied when the replay
// ends, or they would bring it back, blocks and all, in health and
// metrics until the pool's set next changed.
func TestReplayHeldMessagesOfARemovedReplicaAreDropped(t *testing.T) {
	defer noLeaks(t)
	const pod = "127.0.0.1:9193"
	var member atomic.Bool
	member.Store(true)
	ix := NewIndex(Config{})
	l, err := Listen(ListenerConfig{Addr: "tcp://127.0.0.1:5593", Index: ix,
		Resolve:       func(p string) (string, bool) { return p, member.Load() },
		ReplayPort:    func(string) int { return 5594 },
		ReplayTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A replay socket that takes the request and never answers.
	silent := &testEngine{t: t, silent: true, done: make(chan struct{})}
	silent.router = zmq4.NewRouter(context.Background())
	if err := silent.router.Listen("tcp://127.0.0.1:5594"); err != nil {
		t.Fatal(err)
	}
	go silent.serve()
	defer func() {
		_ = silent.router.Close()
		<-silent.done
	}()
	e := newTestEngine(t, "tcp://127.0.0.1:5593", "kv@"+pod+"@m", 0, 100)
	defer e.close()

	runGap(t, ix, e, pod) // the message after the gap is held
	waitFor(t, "the replay request", func() bool { return silent.requests.Load() == 1 })
	member.Store(false)
	ix.Forget(pod)
	if r := waitReplays(t, ix, 1); r != (ReplayStats{Failed: 1}) {
		t.Fatalf("replays %+v, want one failed", r)
	}
	if r, ok := ix.Stats().Replicas[pod]; ok {
		t.Fatalf("the removed replica is back in the index after the replay: %+v", r)
	}
	_ = l.Close()
	e.close()
}
