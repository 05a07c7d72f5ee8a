package kvevents

import (
	"bytes"
	"container/list"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// The handshake half of the listener's guard (guard.go): each ZMTP
// handshake is done here, in its own goroutine and within its deadline,
// and only a peer whose greeting and READY check out is handed to the
// ZMQ library (whose own handshake would block its accept loop, and
// panics on a malformed READY).

// handshake does the peer's half of gc's handshake, hands it to the
// library and closes it unless the library takes it on (reads on after
// the handshake) in time: one it refused, it would leave open for good.
func (l *guardListener) handshake(gc *guardConn, el *list.Element, deadline time.Time) {
	defer l.wg.Done()
	hc, err := preHandshake(gc, pubPeer)
	l.mu.Lock()
	l.shaking.Remove(el) // no-op when evicted
	if err == nil && l.closed {
		err = net.ErrClosed
	}
	if err == nil {
		l.handed[gc] = struct{}{}
	}
	l.mu.Unlock()
	if err != nil {
		_ = gc.Close()
		return
	}
	defer func() {
		l.mu.Lock()
		delete(l.handed, gc)
		l.mu.Unlock()
	}()
	// The read deadline went with the READY (frameDone); writes get
	// their own (handedConn.Write).
	_ = gc.SetWriteDeadline(time.Time{})
	// The library's accept loop waits on nothing but this channel and
	// Open, which reads from memory: it takes a connection at once.
	limit := time.NewTimer(time.Until(deadline) + time.Second)
	defer limit.Stop()
	select {
	case l.ready <- hc:
	case <-limit.C:
		_ = gc.Close()
		return
	case <-l.done:
		_ = gc.Close()
		return
	}
	// It starts reading on a connection it took on (after Open, in a
	// goroutine of its own) at once, too; one whose handshake it refused
	// after all (preHandshake checks what it checks) it never touches
	// again.
	limit.Reset(max(l.lim.handshake, 2*time.Second))
	select {
	case <-hc.adopted:
	case <-limit.C:
		l.g.timeouts.Add(1)
		_ = gc.Close()
	case <-l.done:
		_ = gc.Close()
	}
}

// zmtpNullGreeting is the greeting the library sends on a listening
// socket: ZMTP 3.0, mechanism NULL, as-server 0.
var zmtpNullGreeting = func() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}()

var errHandshake = errors.New("kv_events: not a ZMTP 3 NULL handshake")

// preHandshake sends the library's greeting on gc and reads the peer's
// greeting and READY command (gc's deadline bounds it), checking them as
// the library will, and that the peer's socket type is one okType takes.
// Every ZMQ peer sends its READY without waiting for the other's (NULL
// mechanism), so this needs nothing else from us.
func preHandshake(gc *guardConn, okType func(typ string) bool) (*handedConn, error) {
	if _, err := gc.Write(zmtpNullGreeting); err != nil {
		return nil, err
	}
	pre := make([]byte, 64, 64+9+64)
	if _, err := io.ReadFull(gc, pre); err != nil {
		return nil, err
	}
	// signature, version 3.0 or later, mechanism NULL, as-server 0 or 1
	if pre[0] != 0xff || pre[9] != 0x7f || pre[10] < 3 || string(bytes.TrimRight(pre[12:32], "\x00")) != "NULL" || pre[32] > 1 {
		return nil, errHandshake
	}
	hdr := make([]byte, 2, 9)
	if _, err := io.ReadFull(gc, hdr); err != nil {
		return nil, err
	}
	flags := hdr[0]
	if flags&0x04 == 0 || flags&0x01 != 0 || flags&^0x07 != 0 { // a command, alone
		return nil, errHandshake
	}
	size := uint64(hdr[1])
	if flags&0x02 != 0 {
		hdr = hdr[:9]
		if _, err := io.ReadFull(gc, hdr[2:]); err != nil {
			return nil, err
		}
		size = binary.BigEndian.Uint64(hdr[1:])
	}
	if size < 6 || size > maxReadyBytes {
		return nil, errHandshake
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(gc, body); err != nil {
		return nil, err
	}
	if typ, ok := readySocketType(body); !ok || !okType(typ) || !gc.shaken.Load() {
		return nil, errHandshake
	}
	pre = append(append(pre, hdr...), body...)
	return &handedConn{guardConn: gc, pre: pre, greet: zmtpNullGreeting, adopted: make(chan struct{})}, nil
}

// readySocketType checks a READY command: its name, then well-formed
// properties (name length, name, 4-byte value length, value), and returns
// the peer's Socket-Type. The library must never see a bad one: it parses
// the properties without checking their bounds (a short one panics) and
// panics on a socket type it does not know (none, say), in the goroutine
// that dials or accepts, so one connection would stop the whole process.
// It reads property names title-cased: a name other than Socket-Type
// that may or may not be that to it (SOCKET-TYPE, socket-type) is refused.
func readySocketType(body []byte) (string, bool) {
	meta, ok := bytes.CutPrefix(body, []byte("\x05READY"))
	if !ok {
		return "", false
	}
	var typ []byte
	for len(meta) > 0 {
		klen := int(meta[0])
		if len(meta) < 1+klen+4 {
			return "", false
		}
		key := string(meta[1 : 1+klen])
		vlen := binary.BigEndian.Uint32(meta[1+klen:])
		meta = meta[1+klen+4:]
		if uint64(vlen) > uint64(len(meta)) {
			return "", false
		}
		switch {
		case key == "Socket-Type":
			typ = meta[:vlen]
		case strings.EqualFold(key, "Socket-Type"):
			return "", false
		}
		meta = meta[vlen:]
	}
	return string(typ), typ != nil
}

// pubPeer: the socket types the library pairs with the listener's SUB.
func pubPeer(typ string) bool { return typ == "PUB" || typ == "XPUB" }

// dealerPeer: those it pairs with the replay's DEALER.
func dealerPeer(typ string) bool { return typ == "ROUTER" || typ == "DEALER" || typ == "REP" }

// handedConn is a connection whose handshake the guard did, for the
// library: its reads return the peer's greeting and READY first, and the
// library's greeting, already sent, is checked and not sent again.
type handedConn struct {
	*guardConn
	pre       []byte // the peer's handshake bytes not yet read (reads are serial)
	wmu       sync.Mutex
	greet     []byte // of our greeting, what the library has not written yet
	adopted   chan struct{}
	adoptOnce sync.Once
}

var errGreetingDiffers = errors.New("kv_events: the ZMQ library's greeting is not the one the guard sent")

func (c *handedConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	// The library reads on only after a handshake it accepted.
	c.adoptOnce.Do(func() { close(c.adopted) })
	return c.guardConn.Read(p)
}

func (c *handedConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	if len(c.greet) == 0 {
		c.wmu.Unlock()
		return c.write(p)
	}
	k := min(len(p), len(c.greet))
	same := bytes.Equal(p[:k], c.greet[:k])
	c.greet = c.greet[k:]
	c.wmu.Unlock()
	if !same {
		_ = c.Close()
		return 0, errGreetingDiffers
	}
	if k == len(p) {
		return k, nil
	}
	n, err := c.write(p[k:])
	return k + n, err
}

// write writes within a deadline, and closes the connection when it
// fails. The library writes (subscriptions, PONGs) to every connection
// from its accept loop and holds its writer's lock meanwhile, with no
// deadline of its own: a publisher that stopped reading would otherwise
// block the loop, and every later publisher, for good.
func (c *handedConn) write(p []byte) (int, error) {
	_ = c.guardConn.SetWriteDeadline(time.Now().Add(max(c.lim.handshake, 2*time.Second)))
	n, err := c.guardConn.Write(p)
	if err != nil {
		_ = c.Close()
	}
	return n, err
}
