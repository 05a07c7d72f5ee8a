package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"

	"github.com/sluice-router/sluice/lb/redistest"
	"github.com/sluice-router/sluice/lb/streamrelay"
)

// testEngine publishes KV events the way vLLM's ZmqEventPublisher does
// (vllm/distributed/kv_events.py, see replay.go): a PUB that dials the
// listener, each message also kept in a buffer of the last steps ones,
// and a ROUTER bound on loopback that answers a request [id, "", start]
// with [id, "", seq, payload] for each buffered message from start on,
// then [id, "", ff×8, ""].
type testEngine struct {
	t      *testing.T
	topic  string
	pub    zmq4.Socket
	router zmq4.Socket // nil: no replay socket
	done   chan struct{}

	mu    sync.Mutex
	seq   uint64
	buf   []testBuffered
	steps int

	// simShape answers like llm-d-inference-sim: ["", topic, seq,
	// payload], end ["", "", ff×8, ""].
	simShape bool
	// extra: a protocol breach to check, sent before the real answers:
	// vLLM shape, the message before the one asked (when buffered); sim
	// shape, the asked one under another topic.
	extra bool
	// silent: requests are taken and never answered.
	silent   bool
	requests atomic.Int32
}

type testBuffered struct {
	seq     uint64
	payload []byte
}

// newTestEngine publishes topic to listen and answers replays on router
// (from newReplayRouter; nil: no replay socket).
func newTestEngine(t *testing.T, listen, topic string, router zmq4.Socket, steps int) *testEngine {
	t.Helper()
	e := &testEngine{t: t, topic: topic, pub: newPub(t, listen), router: router, steps: steps, done: make(chan struct{})}
	if router == nil {
		close(e.done)
		return e
	}
	go e.serve()
	return e
}

// newReplayRouter binds an engine's replay ROUTER on a free loopback port
// and returns it with the port, for the listener's ReplayPort.
func newReplayRouter(t *testing.T) (zmq4.Socket, int) {
	t.Helper()
	r := zmq4.NewRouter(context.Background())
	if err := r.Listen("tcp://127.0.0.1:0"); err != nil {
		_ = r.Close()
		t.Fatal(err)
	}
	return r, portOf(r.Addr())
}

// newSilentEngine is a replay socket that takes requests and never
// answers, on a free loopback port; stop closes it.
func newSilentEngine(t *testing.T) (silent *testEngine, port int, stop func()) {
	t.Helper()
	silent = &testEngine{t: t, silent: true, done: make(chan struct{})}
	silent.router, port = newReplayRouter(t)
	go silent.serve()
	return silent, port, func() {
		_ = silent.router.Close()
		<-silent.done
	}
}

func be8(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

// publish sends the next message on the PUB, then buffers it (vLLM's
// order); it returns its sequence number.
func (e *testEngine) publish(payload []byte) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	send(e.t, e.pub, e.topic, e.seq, payload)
	return e.buffer(payload)
}

// lose buffers the next message without sending it: lost on the way.
func (e *testEngine) lose(payload []byte) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.buffer(payload)
}

func (e *testEngine) buffer(payload []byte) uint64 {
	s := e.seq
	e.seq++
	e.buf = append(e.buf, testBuffered{s, payload})
	if len(e.buf) > e.steps {
		e.buf = e.buf[len(e.buf)-e.steps:]
	}
	return s
}

func (e *testEngine) serve() {
	defer close(e.done)
	for {
		msg, err := e.router.Recv()
		if err != nil {
			return // closed
		}
		e.requests.Add(1)
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 || e.silent {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		answer := func(topic string, seq uint64, payload []byte) {
			frames := [][]byte{id, {}, be8(seq), payload}
			if e.simShape {
				frames = [][]byte{id, {}, []byte(topic), be8(seq), payload}
			}
			_ = e.router.SendMulti(zmq4.NewMsgFrom(frames...))
		}
		e.mu.Lock()
		if e.extra {
			for _, b := range e.buf {
				switch {
				case !e.simShape && b.seq+1 == start:
					answer(e.topic, b.seq, b.payload)
				case e.simShape && b.seq == start:
					answer("kv@127.0.0.1:1@other", b.seq, b.payload)
				}
			}
		}
		for _, b := range e.buf {
			if b.seq >= start {
				answer(e.topic, b.seq, b.payload)
			}
		}
		answer("", replayEnd, []byte{})
		e.mu.Unlock()
	}
}

func (e *testEngine) close() {
	_ = e.pub.Close()
	if e.router != nil {
		_ = e.router.Close()
	}
	<-e.done
}

// listenReplay listens on a free loopback port; its engines' replay
// sockets are on replayPort.
func listenReplay(t *testing.T, ix *Index, replayPort int) *Listener {
	t.Helper()
	return listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll, ReplayPort: func(string) int { return replayPort }})
}

func holds(ix *Index, tokens []uint32, replica string) int {
	return ix.Match(ix.Keys(tokens), []string{replica})[0]
}

// gapScenario: the engine's first message (two blocks of prompt) lands,
// the next (prompt's third block) is lost on the way, the one after (a
// block of another prompt) arrives and shows the gap.
type gapScenario struct {
	prompt, other []uint32
}

func runGap(t *testing.T, ix *Index, e *testEngine, pod string) gapScenario {
	t.Helper()
	g := gapScenario{prompt: seqTokens(0, 48), other: seqTokens(1000, 16)}
	// PUB drops messages until the subscription reaches it: publish (each
	// a new sequence number) until one lands.
	waitFor(t, "the first batch", func() bool {
		e.publish(batchPayload(t, vllmStored(anyHashes(1, 2), nil, g.prompt[:32], 16)))
		return holds(ix, g.prompt, pod) == 2
	})
	e.lose(batchPayload(t, vllmStored(anyHashes(3), uint64(2), g.prompt[32:], 16)))
	e.publish(batchPayload(t, vllmStored(anyHashes(10), nil, g.other, 16)))
	return g
}

func waitReplays(t *testing.T, ix *Index, n uint64) ReplayStats {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d replay outcomes", n), func() bool {
		r := ix.Stats().Replays
		return r.Recovered+r.TooOld+r.Failed >= n
	})
	return ix.Stats().Replays
}

// A lost message is fetched from the engine's replay socket: the index
// holds its blocks (cleared without replay), in order with the message
// that showed the gap; no gap is counted. Both answer shapes (vLLM's and
// llm-d-inference-sim's); an answer outside the asked range or for
// another topic is dropped and counted.
func TestReplayRecoversAGap(t *testing.T) {
	for _, sim := range []bool{false, true} {
		t.Run(fmt.Sprintf("sim_shape=%v", sim), func(t *testing.T) {
			defer noLeaks(t)
			ix := NewIndex(Config{})
			router, rport := newReplayRouter(t)
			l := listenReplay(t, ix, rport)
			defer l.Close()
			const pod = "127.0.0.1:9180"
			e := newTestEngine(t, endpoint(l), "kv@"+pod+"@m", router, 100)
			e.simShape, e.extra = sim, true
			defer e.close()

			g := runGap(t, ix, e, pod)
			if r := waitReplays(t, ix, 1); r != (ReplayStats{Recovered: 1}) {
				t.Fatalf("replays %+v, want one recovered", r)
			}
			s := ix.Stats()
			if got := holds(ix, g.prompt, pod); got != 3 {
				t.Errorf("prompt: %d blocks held, want 3 (the lost message's block replayed)", got)
			}
			if got := holds(ix, g.other, pod); got != 1 {
				t.Errorf("other: %d blocks held, want 1 (the held message applied)", got)
			}
			if s.Gaps != 0 || s.Drops[ReasonReplay] != 1 {
				t.Errorf("gaps %d, replay_mismatch drops %d: want 0 and 1", s.Gaps, s.Drops[ReasonReplay])
			}
			_ = l.Close()
			e.close()
		})
	}
}

// The engine's buffer no longer holds the lost message: cleared as
// without replay, counted too_old; the message that showed the gap is
// applied after the clear.
func TestReplayTooOldClears(t *testing.T) {
	defer noLeaks(t)
	ix := NewIndex(Config{})
	router, rport := newReplayRouter(t)
	l := listenReplay(t, ix, rport)
	defer l.Close()
	const pod = "127.0.0.1:9181"
	e := newTestEngine(t, endpoint(l), "kv@"+pod+"@m", router, 1) // buffer_steps 1
	defer e.close()

	g := runGap(t, ix, e, pod)
	if r := waitReplays(t, ix, 1); r != (ReplayStats{TooOld: 1}) {
		t.Fatalf("replays %+v, want one too_old", r)
	}
	if a, b := holds(ix, g.prompt, pod), holds(ix, g.other, pod); a != 0 || b != 1 {
		t.Errorf("held %d of prompt, %d of other: want 0 (cleared) and 1", a, b)
	}
	if s := ix.Stats(); s.Gaps != 1 {
		t.Errorf("gaps %d, want 1", s.Gaps)
	}
	_ = l.Close()
	e.close()
}

// No replay socket: cleared within the bound, failed. Then a socket that
// takes the request and never answers: failed at the bound. Then, with
// replays bounded at an hour: more messages held than the bound gives up
// (failed, cleared); Close with a replay in flight stops it, counts
// nothing more, and leaves no goroutine.
func TestReplayFailsAndCloseStopsIt(t *testing.T) {
	defer noLeaks(t)
	ix := NewIndex(Config{})
	// The engine's replay port: first one that refuses connections, then
	// a silent socket's.
	var replayPort atomic.Int64
	replayPort.Store(int64(refusingPort(t)))
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll,
		ReplayPort: func(string) int { return int(replayPort.Load()) }})
	defer l.Close()
	const pod = "127.0.0.1:9184"
	e := newTestEngine(t, endpoint(l), "kv@"+pod+"@m", nil, 100)
	defer e.close()

	g := runGap(t, ix, e, pod)
	if r := waitReplays(t, ix, 1); r != (ReplayStats{Failed: 1}) {
		t.Fatalf("replays %+v, want one failed", r)
	}
	if a, b := holds(ix, g.prompt, pod), holds(ix, g.other, pod); a != 0 || b != 1 {
		t.Errorf("held %d of prompt, %d of other: want 0 (cleared) and 1", a, b)
	}

	// A silent replay socket on the port.
	silent, silentPort, stopSilent := newSilentEngine(t)
	defer stopSilent()
	replayPort.Store(int64(silentPort))
	lostGap := func(ix *Index, e *testEngine) {
		waitFor(t, "the prompt again", func() bool {
			e.publish(batchPayload(t, vllmStored(anyHashes(1, 2), nil, g.prompt[:32], 16)))
			return holds(ix, g.prompt, pod) == 2
		})
		e.lose(batchPayload(t, vllmRemoved(1)))
		e.publish(batchPayload(t, vllmRemoved(10)))
	}
	lostGap(ix, e)
	if r := waitReplays(t, ix, 2); r != (ReplayStats{Failed: 2}) {
		t.Fatalf("replays %+v, want two failed", r)
	}
	if a, s := holds(ix, g.prompt, pod), ix.Stats(); a != 0 || s.Gaps != 2 || silent.requests.Load() != 1 {
		t.Errorf("held %d of prompt, gaps %d, requests %d: want 0, 2, 1", a, s.Gaps, silent.requests.Load())
	}
	_ = l.Close()
	e.close()

	// A listener whose replays may take an hour: Close must stop them.
	ix2 := NewIndex(Config{})
	l2 := listenAny(t, ListenerConfig{Index: ix2, Resolve: resolveAll,
		ReplayPort: func(string) int { return silentPort }, ReplayTimeout: time.Hour})
	defer l2.Close()
	e2 := newTestEngine(t, endpoint(l2), "kv@"+pod+"@m", nil, 100)
	defer e2.close()
	// More held messages than the bound: the replay is given up (failed),
	// the rank cleared, the held messages applied.
	lostGap(ix2, e2)
	waitFor(t, "the second request", func() bool { return silent.requests.Load() == 2 })
	waitFor(t, "the hold to be given up", func() bool {
		for i := 0; i < 100; i++ {
			e2.publish(batchPayload(t, vllmStored(anyHashes(20), nil, g.other, 16)))
		}
		return ix2.Stats().Replays == ReplayStats{Failed: 1}
	})
	waitFor(t, "the given-up replay to end", func() bool {
		l2.rmu.Lock()
		defer l2.rmu.Unlock()
		return len(l2.pending) == 0 && l2.heldBytes == 0
	})
	if a, b, s := holds(ix2, g.prompt, pod), holds(ix2, g.other, pod), ix2.Stats(); a != 0 || b != 1 || s.Gaps != 1 {
		t.Errorf("held %d of prompt, %d of other, gaps %d: want 0 (cleared), 1 (held ones applied), 1", a, b, s.Gaps)
	}

	// And Close stops a replay in flight.
	before := goleak.IgnoreCurrent()
	lostGap(ix2, e2)
	waitFor(t, "the third request", func() bool { return silent.requests.Load() == 3 })
	if err := l2.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	// While the silent socket is still there (its end would end the
	// replay too): nothing the replay started is left.
	goleak.VerifyNone(t, before, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
	if r := ix2.Stats().Replays; r != (ReplayStats{Failed: 1}) {
		t.Errorf("replays %+v after close: the stopped one is not counted", r)
	}
	e2.close()
}

// The relay gives the other instances the replayed messages too, in
// order: they see no gap and hold the lost message's blocks.
func TestReplayRelayedInOrder(t *testing.T) { redistest.Each(t, testReplayRelayed) }

func testReplayRelayed(t *testing.T, tg redistest.Target) {
	pool := relayPool(t)
	a := &relayInstance{ix: NewIndex(Config{})}
	router, rport := newReplayRouter(t)
	a.l = listenReplay(t, a.ix, rport)
	a.r = NewRelay(streamrelay.Config{Conn: tg.Conn, Key: RelayKey("", pool)}, a.l)
	t.Cleanup(func() {
		a.r.Close()
		_ = a.l.Close()
	})
	b := newRelayInstance(t, tg, pool)
	const pod = "127.0.0.1:9186"
	e := newTestEngine(t, endpoint(a.l), "kv@"+pod+"@m", router, 100)
	t.Cleanup(e.close)

	g := runGap(t, a.ix, e, pod)
	if r := waitReplays(t, a.ix, 1); r != (ReplayStats{Recovered: 1}) {
		t.Fatalf("a's replays %+v, want one recovered", r)
	}
	waitFor(t, "b to hold the replayed block and the held one", func() bool {
		return b.holds(g.prompt, pod) == 3 && b.holds(g.other, pod) == 1
	})
	if sa, sb := a.ix.Stats(), b.ix.Stats(); sa.Gaps != 0 || sb.Gaps != 0 || sb.Restarts != 0 {
		t.Errorf("gaps a %d, b %d, restarts b %d: want none", sa.Gaps, sb.Gaps, sb.Restarts)
	}
}

func TestReplayAddr(t *testing.T) {
	for _, c := range []struct {
		pod        string
		port, rank int
		want       string
	}{
		{"10.0.0.1:8000", 5558, 0, "10.0.0.1:5558"},
		{"10.0.0.1:8000", 5558, 3, "10.0.0.1:5561"}, // vLLM offsets the port by the DP rank
		{"[fd00::1]:8000", 5558, 1, "[fd00::1]:5559"},
		{"vllm-0.ns:8000", 5558, 0, "vllm-0.ns:5558"},
		{"10.0.0.1:8000", 65535, 1, ""},
		{"10.0.0.1:8000", 5558, -1, ""},
		{"10.0.0.1:8000", 5558, maxRankOffset, ""},
		{"10.0.0.1:8000", 0, 0, ""},
		{":8000", 5558, 0, ""},
	} {
		got, ok := replayAddr(c.pod, c.port, c.rank)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("replayAddr(%q, %d, %d) = %q, %v; want %q", c.pod, c.port, c.rank, got, ok, c.want)
		}
	}
}
