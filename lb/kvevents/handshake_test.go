package kvevents

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// dialPub dials a PUB socket in the background: the library's Dial waits
// for the whole handshake, with no deadline of its own.
func dialPub(addr string) (<-chan zmq4.Socket, <-chan error) {
	ok, fail := make(chan zmq4.Socket, 1), make(chan error, 1)
	go func() {
		pub := zmq4.NewPub(context.Background())
		if err := pub.Dial(addr); err != nil {
			_ = pub.Close()
			fail <- err
			return
		}
		ok <- pub
	}()
	return ok, fail
}

// Connections that connect and then say nothing (TCP health probes,
// half-open clients, port scans that hold the socket) must not hold up a
// real publisher: each connection's handshake runs on its own, so the
// publisher is indexed long before the first silent one reaches its
// handshake deadline, not after every one of them did in turn.
func TestListenerSilentConnectionsDoNotDelayPublishers(t *testing.T) {
	defer noLeaks(t)
	old := handshakeTimeout
	handshakeTimeout = 4 * time.Second
	defer func() { handshakeTimeout = old }()
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer l.Close()
	addr := l.Addr().String()

	const silent = 16
	for i := 0; i < silent; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	start := time.Now()
	pubc, failc := dialPub("tcp://" + addr)
	var pub zmq4.Socket
	select {
	case pub = <-pubc:
	case err := <-failc:
		t.Fatalf("dial behind %d silent connections: %v", silent, err)
	case <-time.After(20 * time.Second):
		_ = l.Close() // ends the dial
		t.Fatalf("a publisher behind %d silent connections did not finish its handshake in 20s (guard %+v)",
			silent, l.GuardStats())
	}
	defer pub.Close()
	prompt := seqTokens(0, 16)
	seq := uint64(1)
	waitFor(t, "the publisher's first batch", func() bool {
		send(t, pub, "kv@127.0.0.1:9152@m", seq, batchPayload(t, vllmStored(anyHashes(1), nil, prompt, 16)))
		seq++
		return ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9152"})[0] == 1
	})
	if g := l.GuardStats(); g.HandshakeTimeouts != 0 {
		t.Fatalf("indexed after %v, once %d silent connections had reached the %v handshake deadline: it waited for them",
			time.Since(start).Round(time.Millisecond), g.HandshakeTimeouts, handshakeTimeout)
	}
	_ = l.Close()
	_ = pub.Close()
}

// A peer that completes the handshake but that the library then refuses
// (a socket type that cannot talk to SUB: another SUB, a REQ...) must give
// its slot back too: the library neither closes nor reads such a
// connection, so held against the connection limit it would stay for good,
// and 1,024 of them lock every engine out.
func TestListenerRefusedPeersFreeTheirSlots(t *testing.T) {
	defer noLeaks(t)
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer l.Close()
	addr := l.Addr().String()

	const peers = 1100 // over the guard's 1,024 connections
	for i := 0; i < peers; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		// Both ends see the other's READY, then refuse the pair.
		if _, err := zmq4.Open(c, null.Security(), zmq4.Sub, nil, false, nil); err == nil {
			t.Fatalf("peer %d: a SUB was accepted by a SUB", i)
		}
		_ = c.Close()
	}

	prompt := seqTokens(0, 16)
	pubc, failc := dialPub("tcp://" + addr)
	var pub zmq4.Socket
	select {
	case pub = <-pubc:
	case err := <-failc:
		t.Fatalf("a publisher after %d refused peers: %v (guard %+v)", peers, err, l.GuardStats())
	case <-time.After(20 * time.Second):
		_ = l.Close()
		t.Fatalf("a publisher after %d refused peers did not finish its handshake in 20s (guard %+v)", peers, l.GuardStats())
	}
	defer pub.Close()
	seq := uint64(1)
	deadline := time.Now().Add(20 * time.Second)
	for ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9153"})[0] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a real publisher after %d refused peers never got through: guard %+v", peers, l.GuardStats())
		}
		send(t, pub, "kv@127.0.0.1:9153@m", seq, batchPayload(t, vllmStored(anyHashes(1), nil, prompt, 16)))
		seq++
		time.Sleep(20 * time.Millisecond)
	}
	_ = l.Close()
	_ = pub.Close()
}

// rawHandshake sends a greeting and a READY with the given metadata on a
// new connection.
func rawHandshake(t *testing.T, addr string, meta []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	body := append([]byte("\x05READY"), meta...)
	msg := append(zmtpGreeting(), 0x04, byte(len(body)))
	if _, err := c.Write(append(msg, body...)); err != nil {
		t.Fatal(err)
	}
	return c
}

// prop is one ZMTP metadata property.
func prop(k, v string) []byte {
	b := append([]byte{byte(len(k))}, k...)
	b = append(b, byte(len(v)>>24), byte(len(v)>>16), byte(len(v)>>8), byte(len(v)))
	return append(b, v...)
}

// readsEOF reports whether the server closed c within d (false: it still
// holds it open).
func readsEOF(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 256)
	for {
		if _, err := c.Read(buf); err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

// The ZMQ library parses a READY command's properties without checking
// their bounds: a property cut short panicked its accept goroutine, which
// took the whole process down, from one connection and 75 bytes. The guard
// checks the handshake first and closes such a connection.
func TestListenerMalformedReadyDoesNotCrash(t *testing.T) {
	defer noLeaks(t)
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer l.Close()
	addr := l.Addr().String()
	for name, meta := range map[string][]byte{
		"no value length":     {0x01, 'a'},
		"value length short":  {0x01, 'a', 0, 0},
		"value past the end":  append(prop("Socket-Type", "PUB"), 0x01, 'a', 0, 0, 0, 9, 'x'),
		"name past the end":   {0x09, 'a'},
		"a SUB":               prop("Socket-Type", "SUB"),
		"no socket type":      prop("Identity", ""),
		"socket type cut off": prop("Socket-Type", "PUB")[:15],
		"an unknown type":     prop("Socket-Type", "FOO"),
		"SOCKET-TYPE":         prop("SOCKET-TYPE", "PUB"),
		"two socket types":    append(prop("Socket-Type", "PUB"), prop("socket-type", "SUB")...),
	} {
		c := rawHandshake(t, addr, meta)
		if !readsEOF(c, 10*time.Second) {
			t.Errorf("%s: the connection is still open", name)
		}
		_ = c.Close()
	}
	pub := newPub(t, "tcp://"+addr)
	defer pub.Close()
	prompt := seqTokens(0, 16)
	seq := uint64(1)
	waitFor(t, "a real publisher after the malformed handshakes", func() bool {
		send(t, pub, "kv@127.0.0.1:9154@m", seq, batchPayload(t, vllmStored(anyHashes(1), nil, prompt, 16)))
		seq++
		return ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9154"})[0] == 1
	})
	_ = l.Close()
	_ = pub.Close()
}

// The handshakes in progress are bounded: past the bound the oldest is
// cut, so silent connections hold at most that many, and a new one (a
// real publisher) still gets through at once.
func TestListenerPendingHandshakesBounded(t *testing.T) {
	defer noLeaks(t)
	old := maxPendingHandshakes
	maxPendingHandshakes = 4
	defer func() { maxPendingHandshakes = old }()
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer l.Close()
	addr := l.Addr().String()
	const silent = 12
	var conns []net.Conn
	for i := 0; i < silent; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	waitFor(t, "the silent connections over the bound cut", func() bool { return l.GuardStats().HandshakesEvicted == silent-4 })
	pub := newPub(t, "tcp://"+addr) // cuts one more
	defer pub.Close()
	prompt := seqTokens(0, 16)
	seq := uint64(1)
	waitFor(t, "the publisher's first batch", func() bool {
		send(t, pub, "kv@127.0.0.1:9155@m", seq, batchPayload(t, vllmStored(anyHashes(1), nil, prompt, 16)))
		seq++
		return ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9155"})[0] == 1
	})
	if g := l.GuardStats(); g.HandshakesEvicted != silent-3 || g.HandshakeTimeouts != 0 {
		t.Fatalf("guard stats: %+v, want %d evicted, no timeout", g, silent-3)
	}
	// The oldest were cut; the three newest still wait for their deadline.
	for i, c := range conns {
		if closed, want := readsEOF(c, 200*time.Millisecond), i < silent-3; closed != want {
			t.Errorf("silent connection %d: closed %v, want %v", i, closed, want)
		}
	}
	_ = l.Close()
	_ = pub.Close()
}

// A connection the library does not take on after its handshake (one it
// refused after all: preHandshake checks what it checks, so none should
// be) is closed, its slot back: the library would never touch it again.
func TestGuardClosesWhatTheLibraryLeaves(t *testing.T) {
	defer noLeaks(t)
	old := handshakeTimeout
	handshakeTimeout = 300 * time.Millisecond
	defer func() { handshakeTimeout = old }()
	const bindKey = "127.0.0.1:0" // the key while it binds, as Listen's
	g := &guardState{lim: defaultGuardLimits(Limits{}.withDefaults())}
	guardRegistry.Store(bindKey, g)
	ln, err := guardTransportImpl{}.Listen(context.Background(), bindKey)
	guardRegistry.Delete(bindKey)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	c := rawHandshake(t, addr, prop("Socket-Type", "PUB"))
	defer c.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	// What the library's Open reads (the peer's greeting and READY), then
	// nothing more.
	if _, err := io.ReadFull(sc, make([]byte, 64+2+6+len(prop("Socket-Type", "PUB")))); err != nil {
		t.Fatal(err)
	}
	if !readsEOF(c, 10*time.Second) {
		t.Fatal("a connection the library left is still open")
	}
	if n := g.timeouts.Load(); n != 1 {
		t.Fatalf("%d handshake timeouts, want 1", n)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
}

// A connection's writes have a deadline, and one that fails closes it: the
// library writes from its accept loop, holding its writer's lock.
func TestHandedConnWriteDeadline(t *testing.T) {
	a, b := net.Pipe() // a write blocks until b reads, and b never does
	defer b.Close()
	hc := &handedConn{guardConn: &guardConn{Conn: a, lim: guardLimits{handshake: 10 * time.Millisecond}}}
	start := time.Now()
	if _, err := hc.Write([]byte("\x00\x04\x01kv@")); err == nil {
		t.Fatal("a write nobody reads succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the write took %v", d)
	}
	if !hc.closed.Load() {
		t.Fatal("the connection is still open after its write failed")
	}
}

// The replay dials the engine's replay socket, and the library parses that
// peer's READY too: a malformed one (or an unknown socket type) panicked
// the replay's goroutine. The replay fails instead.
func TestReplayMalformedReadyDoesNotCrash(t *testing.T) {
	defer noLeaks(t)
	fake, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		for _, meta := range [][]byte{{0x01, 'a'}, prop("Socket-Type", "FOO")} {
			c, err := fake.Accept()
			if err != nil {
				return
			}
			body := append([]byte("\x05READY"), meta...)
			msg := append(zmtpGreeting(), 0x04, byte(len(body)))
			_, _ = c.Write(append(msg, body...))
			_, _ = io.Copy(io.Discard, c) // until the replay closes it
			_ = c.Close()
		}
	}()
	ix := NewIndex(Config{})
	l := listenReplay(t, ix, portOf(fake.Addr()))
	defer l.Close()
	const pod = "127.0.0.1:9195"
	e := newTestEngine(t, endpoint(l), "kv@"+pod+"@m", nil, 100)
	defer e.close()
	g := runGap(t, ix, e, pod)
	if r := waitReplays(t, ix, 1); r != (ReplayStats{Failed: 1}) {
		t.Fatalf("replays %+v, want one failed", r)
	}
	// The second kind: another gap.
	e.lose(batchPayload(t, vllmRemoved(10)))
	e.publish(batchPayload(t, vllmStored(anyHashes(11), nil, g.other, 16)))
	if r := waitReplays(t, ix, 2); r != (ReplayStats{Failed: 2}) {
		t.Fatalf("replays %+v, want two failed", r)
	}
	_ = l.Close()
	e.close()
	_ = fake.Close()
	<-served
}
