package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Recovering a sequence gap through the engine's replay socket.
//
// The protocol, as read in vLLM's vllm/distributed/kv_events.py (class
// ZmqEventPublisher, vllm-project/vllm at 0181ea3; SGLang's
// python/sglang/srt/disaggregation/kv_events.py has the same class):
//
//   - __init__ / _socket_setup: with replay_endpoint set in
//     --kv-events-config, the publisher binds a ROUTER socket there. Like
//     the PUB endpoint, its TCP port is offset by the data-parallel rank
//     (offset_endpoint_port: port + rank for rank > 0).
//   - _publisher_thread: each message gets the next sequence number
//     (itertools.count, from 0, per publisher), is sent on the PUB as
//     [topic, seq (8-byte big-endian), payload], and only then appended as
//     (seq, payload) to a deque of buffer_steps entries (default 10000,
//     oldest dropped). Between two publishes the same thread polls the
//     ROUTER and serves one request (_service_replay).
//   - _service_replay: a request must be exactly 3 frames at the ROUTER,
//     [client identity, empty delimiter, start seq (8-byte big-endian)]; any
//     other shape is logged and gets no answer. For every buffered
//     (seq, payload) with seq >= start, oldest first, it sends [identity,
//     "", seq (8-byte big-endian), payload], then the end marker [identity,
//     "", -1 as 8-byte big-endian signed (ff×8), ""]. A start older than the
//     buffer gets what the buffer holds, with no error: the client sees the
//     first answer's sequence is past what it asked. So a DEALER sends
//     ["", start] and receives ["", seq, payload] per message and
//     ["", ff×8, ""] at the end. The answer names no topic (one publisher,
//     one topic); the payload carries data_parallel_rank.
//
// llm-d-inference-sim has the same request since its main branch after
// v0.10.2 (pkg/kv-cache/kv_events_replayer.go, --kv-events-replay-endpoint,
// port offset by rank too), answering with the topic as well: ["", topic,
// seq, payload] per message and ["", "", ff×8, ""] at the end. Both shapes
// are read here; v0.10.2 itself has no replay socket.
//
// What the Listener does with it: on a gap in a topic's sequence (per
// data-parallel rank) whose replica has a replay port, instead of clearing
// the rank at once it holds that topic's new messages, asks the engine for
// the first missing sequence on its own goroutine, applies the answers
// that fill the gap through the index's Apply as they come (so sequences
// stay checked), then the held messages. An answer that does not start
// at the first missing sequence (the buffer is past it) is too_old; no
// answer, a bad one, a hole, or no end within the bound (2 s) is failed,
// and so is a hold past its bounds (1024 messages of the topic, or
// 4×MaxPayloadBytes held over all topics) or a gap met with 8 replays
// already running. All of these apply the held messages, which clears
// the rank as before. The engine's answers are outside input: its
// connection has the listener's framing guard, each payload the decode
// limits. A restart (the sequence going back) is not replayed.
//
// Limit: vLLM's sequence numbers carry no epoch. An engine that restarted
// unseen (none of its new messages reached the listener until its new
// sequence passed the old one) shows as a gap, and the replay then applies
// the new engine's messages on top of the old entries.

// Replay outcomes: the result label of sluice_kv_events_replays_total.
const (
	ReplayRecovered = "recovered" // the gap was filled from the engine's buffer
	ReplayTooOld    = "too_old"   // the engine's buffer no longer held the first missing message
	ReplayFailed    = "failed"    // no or a bad answer, over a bound, or no replay slot free
)

// ReplayStats counts the gaps met on topics whose replica has a replay
// socket, by outcome.
type ReplayStats struct {
	Recovered uint64
	TooOld    uint64
	Failed    uint64
}

// Bounds on replays.
const (
	// DefaultReplayTimeout bounds one replay, dial to last answer.
	DefaultReplayTimeout = 2 * time.Second
	// maxReplays in flight at once, all topics.
	maxReplays = 8
	// maxHeld messages of a topic held while its replay runs; beyond, the
	// replay is given up (failed).
	maxHeld = 1024
	// maxRankOffset: a data-parallel rank at or above it has no replay
	// address (the port offset would reach far outside what was set).
	maxRankOffset = 1024
)

// replayEnd is the end marker's sequence frame (-1 as signed 64-bit).
const replayEnd = ^uint64(0)

// replayAddr is the replay socket of a pod's engine for a data-parallel
// rank: the pod's host, port offset by the rank (vLLM's
// offset_endpoint_port).
func replayAddr(pod string, port, rank int) (string, bool) {
	host, _, err := net.SplitHostPort(pod)
	if err != nil || host == "" || port < 1 || rank < 0 || rank >= maxRankOffset || port+rank > 65535 {
		return "", false
	}
	return net.JoinHostPort(host, strconv.Itoa(port+rank)), true
}

// replay is one topic's (and rank's) replay in flight, guarded by
// Listener.rmu.
type replay struct {
	sk    seqKey
	name  string // the replica
	from  uint64 // first missing sequence (asked)
	until uint64 // the sequence that showed the gap
	// socket: the gap was seen on the socket, so the replayed messages
	// go to the taps (the relay) too.
	socket bool
	// holding: the topic's new messages wait in held; false once the
	// replay ended or was given up.
	holding bool
	held    []heldMsg
	bytes   int // frames held (counted in Listener.heldBytes too)
	cancel  context.CancelFunc
}

type heldMsg struct {
	name   string
	m      Message
	frames [][]byte
	socket bool
}

func framesSize(frames [][]byte) int {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	return n
}

// maxHeldBytes bounds the frames held, all topics (64 MiB by default).
func (l *Listener) maxHeldBytes() int { return 4 * l.lim.MaxPayloadBytes }

// hold decides, with rmu held, whether the message waits for a replay:
// its topic has one running, or it shows a gap a replay can fill (then
// the replay starts). False: apply it now.
func (l *Listener) hold(name string, m Message, frames [][]byte, socket bool) bool {
	sk := seqKey{topic: m.Topic, rank: m.Batch.DPRank}
	h := heldMsg{name: name, m: m, frames: frames, socket: socket}
	if r := l.pending[sk]; r != nil {
		if !r.holding {
			// Given up and still closing: no second replay of the topic.
			if l.isGap(sk, m) && l.replayPort(m.Pod) > 0 {
				l.ix.countReplay(ReplayFailed)
			}
			return false
		}
		if n := framesSize(frames); len(r.held) < maxHeld && l.heldBytes+n <= l.maxHeldBytes() {
			r.held = append(r.held, h)
			r.bytes += n
			l.heldBytes += n
			return true
		}
		// Over the bounds: give up, clear as without replay.
		l.release(r)
		l.ix.countReplay(ReplayFailed)
		return false
	}
	if !l.isGap(sk, m) {
		return false
	}
	port := l.replayPort(m.Pod)
	if port <= 0 {
		return false
	}
	addr, ok := replayAddr(m.Pod, port, m.Batch.DPRank)
	n := framesSize(frames)
	if !ok || l.inflight >= maxReplays || l.heldBytes+n > l.maxHeldBytes() || l.ctx.Err() != nil {
		l.ix.countReplay(ReplayFailed)
		return false
	}
	last, _ := l.ix.lastSeq(sk)
	ctx, cancel := context.WithTimeout(l.ctx, l.replayTimeout)
	r := &replay{sk: sk, name: name, from: last + 1, until: m.Seq, socket: socket, holding: true,
		held: []heldMsg{h}, bytes: n, cancel: cancel}
	l.heldBytes += n
	l.pending[sk] = r
	l.inflight++
	l.replays.Add(1)
	go l.runReplay(ctx, r, addr)
	return true
}

// isGap: the message's sequence is past the next one expected.
func (l *Listener) isGap(sk seqKey, m Message) bool {
	last, seen := l.ix.lastSeq(sk)
	return seen && m.Seq > last+1
}

// release ends a replay's hold (rmu held) and applies the held messages.
func (l *Listener) release(r *replay) {
	r.holding = false
	r.cancel()
	held := r.held
	l.heldBytes -= r.bytes
	r.held, r.bytes = nil, 0
	for _, h := range held {
		// Resolved again: its replica may have left the pool (and the
		// index) while it was held; applied, it would come back.
		if _, ok := l.resolve(h.m.Pod); !ok {
			l.ix.CountDrop(ReasonUnknownPod)
			continue
		}
		l.apply(h.name, h.m, h.frames, h.socket)
	}
}

// runReplay asks the engine, applies what fills the gap, then the held
// messages.
func (l *Listener) runReplay(ctx context.Context, r *replay, addr string) {
	defer l.replays.Done()
	result := l.fetchReplay(ctx, r, addr)
	r.cancel()
	l.rmu.Lock()
	defer l.rmu.Unlock()
	l.inflight--
	if l.pending[r.sk] == r {
		delete(l.pending, r.sk)
	}
	if !r.holding {
		return // given up (counted then)
	}
	if l.ctx.Err() != nil {
		// Closed: nothing more reaches the index.
		l.heldBytes -= r.bytes
		r.holding, r.held, r.bytes = false, nil, 0
		return
	}
	l.release(r)
	l.ix.countReplay(result) // after: an outcome counted is an outcome applied
}

// fetchReplay asks addr for r.from onward and applies each answer that
// is the next missing message, until the gap is filled; it returns the
// outcome.
func (l *Listener) fetchReplay(ctx context.Context, r *replay, addr string) string {
	if err := ensureReplayTransport(); err != nil {
		return ReplayFailed
	}
	lim := defaultGuardLimits(l.lim)
	sock := zmq4.NewDealer(context.WithValue(ctx, replayLimitsKey{}, lim),
		zmq4.WithLogger(discardLogger), zmq4.WithDialerMaxRetries(0), zmq4.WithTimeout(l.replayTimeout))
	defer closeAndDrain(sock)
	if err := sock.Dial(replayTransport + "://" + addr); err != nil {
		return ReplayFailed
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], r.from)
	if err := sock.SendMulti(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return ReplayFailed
	}
	topic := []byte(r.sk.topic)
	next := r.from
	for {
		msg, err := sock.Recv()
		if err != nil {
			return ReplayFailed // closed, timed out, or the connection ended
		}
		seqFrame, payload, answerTopic, ok := splitReplayAnswer(msg.Frames)
		if !ok {
			l.ix.CountDrop(ReasonReplay)
			return ReplayFailed
		}
		seq := binary.BigEndian.Uint64(seqFrame)
		switch {
		case seq == replayEnd:
			if next == r.from {
				return ReplayTooOld // nothing at or after the first missing one
			}
			return ReplayFailed // ended inside the gap
		case answerTopic != nil && string(answerTopic) != r.sk.topic:
			l.ix.CountDrop(ReasonReplay) // another publisher's
			continue
		case seq < next:
			l.ix.CountDrop(ReasonReplay) // before what was asked (or again)
			continue
		case seq > next:
			if next == r.from {
				return ReplayTooOld // the buffer starts past the first missing one
			}
			return ReplayFailed // a hole in the answer
		}
		frames := [][]byte{topic, seqFrame, payload}
		m, err := DecodeMessage(frames, l.lim)
		if err != nil {
			l.ix.CountDrop(ReasonOf(err))
			return ReplayFailed
		}
		if m.Batch.DPRank != r.sk.rank {
			l.ix.CountDrop(ReasonReplay)
			continue
		}
		if !l.applyReplayed(r, m, frames) {
			return ReplayFailed
		}
		next++
		if next == r.until {
			return ReplayRecovered
		}
	}
}

// splitReplayAnswer takes one answer at the DEALER apart: ["", seq,
// payload] (vLLM, SGLang) or ["", topic, seq, payload]
// (llm-d-inference-sim; topic nil for the other shape).
func splitReplayAnswer(frames [][]byte) (seq, payload, topic []byte, ok bool) {
	switch {
	case len(frames) == 3 && len(frames[0]) == 0 && len(frames[1]) == 8:
		return frames[1], frames[2], nil, true
	case len(frames) == 4 && len(frames[0]) == 0 && len(frames[2]) == 8:
		return frames[2], frames[3], frames[1], true
	}
	return nil, nil, nil, false
}

// applyReplayed applies one replayed message in its place: the next after
// the index's last for the topic, while the topic is held.
func (l *Listener) applyReplayed(r *replay, m Message, frames [][]byte) bool {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if !r.holding || l.ctx.Err() != nil {
		return false
	}
	if last, seen := l.ix.lastSeq(r.sk); !seen || last+1 != m.Seq {
		return false
	}
	return l.apply(r.name, m, frames, r.socket)
}

// closeAndDrain closes a socket and empties its receive queue: a
// connection goroutine blocked handing over a message would otherwise
// never exit (see Listener.drain).
func closeAndDrain(sock zmq4.Socket) {
	_ = sock.Close()
	for misses := 0; misses < 64; {
		if _, err := sock.Recv(); errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			misses++
		} else {
			misses = 0
		}
	}
}

// The replay dials through its own transport: the ZMQ library would
// otherwise allocate whatever frame size the engine announces. Its
// connections get the listener's framing guard (limits from the socket's
// context) and are closed when the replay's context ends, handshake
// included.
const replayTransport = "sluice-kv-replay"

var (
	registerReplay sync.Once
	replayRegErr   error
)

type replayLimitsKey struct{}

type replayTransportImpl struct{}

func (replayTransportImpl) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	lim, ok := ctx.Value(replayLimitsKey{}).(guardLimits)
	if !ok {
		return nil, errors.New("kv_events: replay dial without limits")
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = c.Close() })
	// The engine's half of the handshake is checked before the library
	// parses it (see readySocketType: a bad one would panic the process).
	gc := &guardConn{Conn: c, lim: lim, greeting: 64}
	_ = c.SetDeadline(time.Now().Add(lim.handshake))
	hc, err := preHandshake(gc, dealerPeer)
	if err != nil {
		_ = gc.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return hc, nil
}

func (replayTransportImpl) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return nil, errors.New("kv_events: the replay transport only dials")
}

func (replayTransportImpl) Addr(ep string) (string, error) { return ep, nil }

func ensureReplayTransport() error {
	registerReplay.Do(func() { replayRegErr = zmq4.RegisterTransport(replayTransport, replayTransportImpl{}) })
	return replayRegErr
}

var discardLogger = log.New(io.Discard, "", 0)

// lastSeq is the last sequence applied for a topic and rank.
func (ix *Index) lastSeq(sk seqKey) (uint64, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	st, seen := ix.seqs[sk]
	return st.seq, seen
}

// countReplay counts one replay outcome.
func (ix *Index) countReplay(result string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	switch result {
	case ReplayRecovered:
		ix.c.replays.Recovered++
	case ReplayTooOld:
		ix.c.replays.TooOld++
	default:
		ix.c.replays.Failed++
	}
}
