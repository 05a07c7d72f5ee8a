package kvevents

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The ZMQ library reads a frame by allocating the size its peer announces
// (up to 2^63 bytes) and accepts frames and connections without bound; it
// also runs each connection's handshake inside its accept loop with no
// deadline, so one silent client would stop every later publisher. The
// listen address is reachable from the network, so the listener goes
// through this guard: a TCP transport whose connections check the ZMTP 3
// framing as it streams past and fail (closing the connection) on a frame
// or message over the limits, and whose listener refuses connections
// beyond a maximum.
//
// The guard's listener does the peer's half of each handshake itself, one
// goroutine a connection, within a deadline: it sends the greeting the
// library would send and reads the peer's greeting and READY. Only then
// does it hand the connection to the library's accept loop, which replays
// that handshake from memory (its greeting, the same bytes, is not sent
// twice), so the loop never waits on the network: a connection that says
// nothing holds up no other. The handshakes in progress are bounded
// (maxPending); past it the oldest is cut to make room, so a burst of
// silent connections delays a real publisher by at most the time its own
// handshake takes, not by the deadline. The peer's greeting and READY are
// checked as the library checks them, and more (readySocketType): the
// library panics on a malformed READY or a socket type it does not know,
// and neither reads nor closes a connection whose handshake it refused
// (a peer that cannot talk to SUB), which would hold its slot for good.
// Should it refuse one all the same, the guard closes it once it is not
// read on.
//
// The library allocates a frame's announced size before its body comes,
// so what all connections have announced and not handed over is bounded
// too (maxInFlight): otherwise a client that announces a frame at the
// limit and goes silent costs maxFrame bytes for a few hundred, maxConns
// times over (16 GiB by default).

const guardTransport = "sluice-kv-tcp"

var registerGuard sync.Once

// handshakeTimeout bounds a connection's greeting and handshake (a var so
// tests can shorten it).
var handshakeTimeout = 10 * time.Second

// maxPendingHandshakes bounds a listener's connections in their handshake
// at once (a var so tests can shrink it).
var maxPendingHandshakes = 128

// maxReadyBytes bounds the peer's READY command (its socket type,
// identity and properties: tens of bytes from vLLM, SGLang and the sim).
const maxReadyBytes = 64 << 10

type guardLimits struct {
	maxFrame, maxMessage int64 // bytes
	maxFrames            int   // frames per message
	maxConns             int64
	maxPending           int // connections in their handshake
	handshake            time.Duration
	// maxInFlight bounds the bytes the listener's connections have
	// announced in messages not yet handed over, all together.
	maxInFlight int64
}

func defaultGuardLimits(lim Limits) guardLimits {
	return guardLimits{
		maxFrame:   int64(lim.MaxPayloadBytes),
		maxMessage: int64(lim.MaxPayloadBytes) + 2*maxTopicBytes,
		maxFrames:  8,
		maxConns:   1024,
		maxPending: maxPendingHandshakes,
		handshake:  handshakeTimeout,
		// four messages at the size limit in progress at once
		maxInFlight: 4 * (int64(lim.MaxPayloadBytes) + 2*maxTopicBytes),
	}
}

// guardRegistry maps a listen address to its guard: transports are global
// in the ZMQ library, so one registered transport serves every Listener.
var guardRegistry sync.Map // host:port -> *guardState

// guardState is one listen address's limits and counters.
type guardState struct {
	lim                                  guardLimits
	refused, oversize, timeouts, evicted atomic.Uint64
	inFlight                             atomic.Int64 // announced bytes not handed over (maxInFlight)
}

type guardTransportImpl struct{}

func (guardTransportImpl) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	return nil, errors.New("kv_events: the guarded transport only listens")
}

func (guardTransportImpl) Addr(ep string) (string, error) { return ep, nil }

func (guardTransportImpl) Listen(ctx context.Context, addr string) (net.Listener, error) {
	v, ok := guardRegistry.Load(addr)
	if !ok {
		return nil, fmt.Errorf("kv_events: no limits registered for %q", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	g := v.(*guardState)
	gl := &guardListener{ln: l, lim: g.lim, g: g, ready: make(chan net.Conn), done: make(chan struct{}),
		handed: make(map[*guardConn]struct{})}
	gl.wg.Add(1)
	go gl.acceptLoop()
	return gl, nil
}

func ensureGuardTransport() error {
	var err error
	registerGuard.Do(func() { err = zmq4.RegisterTransport(guardTransport, guardTransportImpl{}) })
	return err
}

// guardListener accepts connections and does their handshakes (see the
// top of the file); Accept hands the library those that completed one.
type guardListener struct {
	ln     net.Listener
	lim    guardLimits
	g      *guardState
	active atomic.Int64
	ready  chan net.Conn // handshaken, to the library's Accept
	done   chan struct{} // closed by Close
	once   sync.Once
	wg     sync.WaitGroup // acceptLoop and the handshakes

	mu      sync.Mutex
	closed  bool
	shaking list.List               // of *guardConn: handshakes in progress, oldest first
	handed  map[*guardConn]struct{} // handshaken, not yet taken on by the library
}

// Accept returns the next connection that completed its handshake.
func (l *guardListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *guardListener) Addr() net.Addr { return l.ln.Addr() }

// Close stops accepting and closes the connections not yet the library's
// (in their handshake, or handed and not taken on), waiting for their
// goroutines.
func (l *guardListener) Close() error {
	var err error
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		var conns []*guardConn
		for e := l.shaking.Front(); e != nil; e = e.Next() {
			conns = append(conns, e.Value.(*guardConn))
		}
		for c := range l.handed {
			conns = append(conns, c)
		}
		l.mu.Unlock()
		close(l.done)
		err = l.ln.Close()
		for _, c := range conns {
			_ = c.Close()
		}
		l.wg.Wait()
	})
	return err
}

func (l *guardListener) acceptLoop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// out of file descriptors, say: back off as net/http does
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(delay):
				continue
			case <-l.done:
				return
			}
		}
		delay = 0
		if l.active.Add(1) > l.lim.maxConns {
			l.active.Add(-1)
			l.g.refused.Add(1)
			_ = c.Close()
			continue
		}
		deadline := time.Now().Add(l.lim.handshake)
		_ = c.SetDeadline(deadline)
		gc := &guardConn{Conn: c, g: l.g, onClose: func() { l.active.Add(-1) }, lim: l.lim, greeting: 64}
		var evict *guardConn
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = gc.Close()
			return
		}
		if l.shaking.Len() >= max(l.lim.maxPending, 1) {
			evict = l.shaking.Remove(l.shaking.Front()).(*guardConn)
		}
		el := l.shaking.PushBack(gc)
		l.wg.Add(1)
		l.mu.Unlock()
		if evict != nil {
			l.g.evicted.Add(1)
			_ = evict.Close() // its handshake fails at once
		}
		go l.handshake(gc, el, deadline)
	}
}

// guardConn follows ZMTP 3 framing on the bytes read: a 64-byte greeting,
// then frames of [flags, size (1 byte, or 8 with the LONG flag), body].
// g (counters) and onClose are nil on the replay's dialed connections.
type guardConn struct {
	net.Conn
	g        *guardState
	onClose  func()
	lim      guardLimits
	closed   atomic.Bool
	greeting int         // greeting bytes still to come
	hdr      []byte      // header bytes of the current frame so far
	body     int64       // body bytes of the current frame still to come
	inMsg    int64       // bytes of the current message so far
	frames   int         // frames of the current message so far
	shaken   atomic.Bool // the first command (the handshake) went past
	inCmd    bool
	last     bool // the current frame is its message's last
	// Bytes this connection holds of g.inFlight: held in all, done of
	// them in messages read in full, released at the next Read (the
	// library reads the next message only once it handed this one over).
	mu         sync.Mutex
	held, done int64
}

var errGuard = errors.New("kv_events: ZMTP frame over the limits")

func (c *guardConn) Read(p []byte) (int, error) {
	c.releaseDone()
	n, err := c.Conn.Read(p)
	if ferr := c.scan(p[:n]); ferr != nil {
		if c.g != nil {
			c.g.oversize.Add(1)
		}
		_ = c.Close()
		return 0, ferr
	}
	var ne net.Error
	if err != nil && !c.shaken.Load() {
		if c.g != nil && errors.As(err, &ne) && ne.Timeout() {
			c.g.timeouts.Add(1)
		}
		// The handshake fails on it: its slot goes back now.
		_ = c.Close()
	}
	return n, err
}

// Close closes the connection once; later calls return nil (the library
// closes each connection twice when its socket closes, its reader and its
// Close racing, and the loser's "use of closed network connection" would
// be the Listener's Close error).
func (c *guardConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.mu.Lock()
	if c.g != nil {
		c.g.inFlight.Add(-c.held)
	}
	c.held, c.done = 0, 0
	c.mu.Unlock()
	if c.onClose != nil {
		c.onClose()
	}
	return c.Conn.Close()
}

// reserve counts size announced bytes in the listener's in-flight total;
// false when that would pass maxInFlight. Always true on a replay's
// connection (no listener: it is one of at most maxReplays).
func (c *guardConn) reserve(size int64) bool {
	if c.g == nil || size == 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return false
	}
	if c.g.inFlight.Add(size) > c.lim.maxInFlight {
		c.g.inFlight.Add(-size)
		return false
	}
	c.held += size
	return true
}

// messageDone marks the bytes held so far as a message read in full.
func (c *guardConn) messageDone() {
	if c.g == nil {
		return
	}
	c.mu.Lock()
	c.done = c.held
	c.mu.Unlock()
}

// releaseDone gives back the bytes of messages read in full.
func (c *guardConn) releaseDone() {
	if c.g == nil {
		return
	}
	c.mu.Lock()
	if c.done > 0 {
		c.g.inFlight.Add(-c.done)
		c.held -= c.done
		c.done = 0
	}
	c.mu.Unlock()
}

func (c *guardConn) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case c.greeting > 0:
			k := min(c.greeting, len(b))
			c.greeting -= k
			b = b[k:]
		case c.body > 0:
			k := int64(len(b))
			if k > c.body {
				k = c.body
			}
			c.body -= k
			b = b[k:]
			if c.body == 0 {
				c.frameDone()
			}
		default:
			c.hdr = append(c.hdr, b[0])
			b = b[1:]
			flags := c.hdr[0]
			want := 2
			if flags&0x02 != 0 {
				want = 9
			}
			if len(c.hdr) < want {
				continue
			}
			var size int64
			if want == 2 {
				size = int64(c.hdr[1])
			} else {
				for _, x := range c.hdr[1:9] {
					if size > (1<<62)>>8 {
						return errGuard
					}
					size = size<<8 | int64(x)
				}
			}
			c.inCmd = flags&0x04 != 0
			more := flags&0x01 != 0
			c.frames++
			c.inMsg += size
			if size > c.lim.maxFrame || c.inMsg > c.lim.maxMessage || c.frames > c.lim.maxFrames || !c.reserve(size) {
				return errGuard
			}
			c.hdr = c.hdr[:0]
			if !more {
				c.frames, c.inMsg = 0, 0
			}
			c.body, c.last = size, !more
			if size == 0 {
				c.frameDone()
			}
		}
	}
	return nil
}

// frameDone ends a frame: the last of a message marks the message's bytes
// done (see held); the peer's first command (READY) read in full lifts the
// handshake deadline.
func (c *guardConn) frameDone() {
	if c.last {
		c.messageDone()
	}
	if c.inCmd && !c.shaken.Load() {
		c.shaken.Store(true)
		_ = c.Conn.SetReadDeadline(time.Time{})
	}
}
