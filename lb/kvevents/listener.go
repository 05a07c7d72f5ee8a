package kvevents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Resolver maps a topic's pod (host:port) to the replica name the index
// keys on; false drops the message (counted as unknown_pod).
type Resolver func(pod string) (replica string, ok bool)

// Listener is a ZMQ SUB socket that binds (engines dial it: vLLM with a
// non-wildcard endpoint, llm-d-inference-sim always) and feeds an Index.
type Listener struct {
	ix      *Index
	resolve Resolver
	lim     Limits
	addr    string
	guard   *guardState
	sock    zmq4.Socket
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
	now     func() time.Time
	// taps receive every message that reached the index from the socket
	// (not the injected ones): the relay to other instances.
	tapMu sync.Mutex
	taps  atomic.Pointer[[]*tap]

	// Replays (replay.go). rmu orders what reaches the index and the taps:
	// a topic's messages held while its replay runs, the replayed ones.
	ctx           context.Context
	replayPort    func(pod string) int
	replayTimeout time.Duration
	rmu           sync.Mutex
	pending       map[seqKey]*replay
	inflight      int
	heldBytes     int
	replays       sync.WaitGroup
}

type tap struct{ fn func(frames [][]byte) }

// ListenerConfig configures Listen.
type ListenerConfig struct {
	Addr    string // tcp://host:port (host * for every interface)
	Index   *Index
	Resolve Resolver
	Limits  Limits
	Log     io.Writer // the ZMQ library's connection errors; nil discards them
	// ReplayPort gives the port on which the engine of a topic's pod
	// (host:port) serves its replay socket (vLLM's replay_endpoint) at the
	// pod's host, offset by the data-parallel rank; 0 (or a nil func):
	// none, a gap clears the rank's entries at once. See replay.go.
	ReplayPort func(pod string) int
	// ReplayTimeout bounds one replay (default DefaultReplayTimeout).
	ReplayTimeout time.Duration
}

// listenMu orders Listen calls: one asking for port 0 is registered under
// that port only while it binds, then under the port it got.
var listenMu sync.Mutex

// Listen validates the address, binds it and starts feeding the index.
// Port 0 binds a free port; Addr says which.
func Listen(cfg ListenerConfig) (*Listener, error) {
	addr, ix, resolve, lim := cfg.Addr, cfg.Index, cfg.Resolve, cfg.Limits
	hp, err := parseListenAddr(addr, 0)
	if err != nil {
		return nil, err
	}
	if ix == nil || resolve == nil {
		return nil, errors.New("kv_events: listener needs an index and a resolver")
	}
	lim = lim.withDefaults()
	if err := ensureGuardTransport(); err != nil {
		return nil, err
	}
	guard := &guardState{lim: defaultGuardLimits(lim)}
	listenMu.Lock()
	defer listenMu.Unlock()
	if _, dup := guardRegistry.LoadOrStore(hp, guard); dup {
		return nil, fmt.Errorf("kv_events: %s is already listened on", addr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	sock := zmq4.NewSub(ctx, zmq4.WithLogger(log.New(logw, "kv_events: ", 0)))
	if err := sock.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		cancel()
		guardRegistry.Delete(hp)
		return nil, err
	}
	if err := sock.Listen(guardTransport + "://" + hp); err != nil {
		_ = sock.Close()
		cancel()
		guardRegistry.Delete(hp)
		msg := strings.ReplaceAll(err.Error(), guardTransport+"://", "tcp://")
		return nil, fmt.Errorf("kv_events: cannot listen on %s: %s", addr, msg)
	}
	hp = registerBoundPort(hp, sock.Addr(), guard)
	l := &Listener{ix: ix, resolve: resolve, lim: lim, addr: hp, guard: guard, sock: sock, cancel: cancel,
		done: make(chan struct{}), now: time.Now, ctx: ctx, replayPort: cfg.ReplayPort,
		replayTimeout: cfg.ReplayTimeout, pending: make(map[seqKey]*replay)}
	if l.replayTimeout <= 0 {
		l.replayTimeout = DefaultReplayTimeout
	}
	go l.run(ctx)
	return l, nil
}

// Addr is the bound address (its port when 0 was asked).
func (l *Listener) Addr() net.Addr { return l.sock.Addr() }

// registerBoundPort moves the guard of a listener that asked for port 0
// to the port it got, so that port's listeners meet it (already listened
// on) and the next one asking for 0 does not. It returns the key.
func registerBoundPort(hp string, bound net.Addr, g *guardState) string {
	host, port, _ := net.SplitHostPort(hp)
	ta, ok := bound.(*net.TCPAddr)
	if port != "0" || !ok {
		return hp
	}
	key := net.JoinHostPort(host, strconv.Itoa(ta.Port))
	guardRegistry.Delete(hp)
	guardRegistry.Store(key, g)
	return key
}

func (l *Listener) run(ctx context.Context) {
	defer close(l.done)
	for {
		msg, err := l.sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue // one publisher's connection ended
		}
		l.handle(msg.Frames, true)
	}
}

// handle applies one message (socket: from the socket, so the taps see
// it once applied), or holds it while its topic's replay runs.
func (l *Listener) handle(frames [][]byte, socket bool) {
	m, err := DecodeMessage(frames, l.lim)
	if err != nil {
		l.ix.CountDrop(ReasonOf(err))
		return
	}
	name, ok := l.resolve(m.Pod)
	if !ok {
		l.ix.CountDrop(ReasonUnknownPod)
		return
	}
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.replayPort != nil && l.hold(name, m, frames, socket) {
		return
	}
	l.apply(name, m, frames, socket)
}

// apply applies one message and, from the socket, gives it to the taps
// (rmu held, so a topic's messages reach them in the index's order).
// False: dropped.
func (l *Listener) apply(name string, m Message, frames [][]byte, socket bool) bool {
	if !l.ix.Apply(name, m, l.now()) {
		return false
	}
	if socket {
		if ts := l.taps.Load(); ts != nil {
			for _, t := range *ts {
				t.fn(frames)
			}
		}
	}
	return true
}

// Inject applies a message that reached this instance another way (from
// another instance, through the relay), with the same checks as one from
// the socket. Taps do not see it.
func (l *Listener) Inject(frames [][]byte) { l.handle(frames, false) }

// Tap makes fn receive the frames of every message from the socket that
// the index applied, replayed ones included, in the index's order (per
// topic, the engine's sequence order), one call at a time, on the
// listener's goroutine or a replay's (fn must not block or keep the
// frames); the returned func removes it.
func (l *Listener) Tap(fn func(frames [][]byte)) (untap func()) {
	t := &tap{fn}
	l.tapMu.Lock()
	defer l.tapMu.Unlock()
	var next []*tap
	if ts := l.taps.Load(); ts != nil {
		next = append(next, *ts...)
	}
	next = append(next, t)
	l.taps.Store(&next)
	return func() {
		l.tapMu.Lock()
		defer l.tapMu.Unlock()
		if ts := l.taps.Load(); ts != nil {
			next := slices.DeleteFunc(slices.Clone(*ts), func(x *tap) bool { return x == t })
			l.taps.Store(&next)
		}
	}
}

// GuardStats counts connections the socket guard cut off.
type GuardStats struct {
	RefusedConns      uint64 // over the connection limit
	OversizeFrames    uint64 // a frame or message over the limits
	HandshakeTimeouts uint64 // no handshake (or none the ZMQ library took on) within the deadline
	// HandshakesEvicted: handshakes cut, the oldest first, to make room
	// for newer connections over the limit of handshakes in progress.
	HandshakesEvicted uint64
}

// GuardStats returns the guard's counters.
func (l *Listener) GuardStats() GuardStats {
	return GuardStats{RefusedConns: l.guard.refused.Load(), OversizeFrames: l.guard.oversize.Load(),
		HandshakeTimeouts: l.guard.timeouts.Load(), HandshakesEvicted: l.guard.evicted.Load()}
}

// Close stops the listener and its replays and waits for their
// goroutines; messages held for a replay are dropped.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		err = l.sock.Close()
		l.cancel()
		<-l.done
		l.replays.Wait()
		l.drain()
		guardRegistry.Delete(l.addr)
	})
	return err
}

// drain empties the library's receive queue after Close: a connection
// goroutine that read a message just before the close waits to hand it
// over and would otherwise never exit. Recv on a closed socket picks at
// random between its closed context and a queued message, so enough
// consecutive errors mean nothing is queued.
func (l *Listener) drain() {
	for misses := 0; misses < 64; {
		if _, err := l.sock.Recv(); errors.Is(err, context.Canceled) {
			misses++
		} else {
			misses = 0
		}
	}
}
