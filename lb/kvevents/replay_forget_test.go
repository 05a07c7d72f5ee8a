package kvevents

import (
	"sync/atomic"
	"testing"
	"time"
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
	// A replay socket that takes the request and never answers.
	silent, silentPort, stopSilent := newSilentEngine(t)
	defer stopSilent()
	l := listenAny(t, ListenerConfig{Index: ix,
		Resolve:       func(p string) (string, bool) { return p, member.Load() },
		ReplayPort:    func(string) int { return silentPort },
		ReplayTimeout: 500 * time.Millisecond})
	defer l.Close()
	e := newTestEngine(t, endpoint(l), "kv@"+pod+"@m", nil, 100)
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
