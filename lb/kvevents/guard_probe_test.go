package kvevents

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// A connection that never completes the ZMTP handshake (a TCP health
// probe or port scan that connects and closes, an HTTP client on the
// wrong port) must give its slot back: the ZMQ library neither closes a
// connection whose handshake failed nor tells anyone, so counted against
// the connection limit forever, enough of them would lock every engine
// out of the socket.
func TestListenerFailedHandshakesFreeTheirSlots(t *testing.T) {
	defer noLeaks(t)
	old := handshakeTimeout
	handshakeTimeout = 300 * time.Millisecond
	defer func() { handshakeTimeout = old }()
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer l.Close()

	// Over the guard's 1,024 connections, with either kind alone.
	const probes = 2100
	for i := 0; i < probes; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			// a wrong greeting: the handshake fails without a read error
			_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: probe\r\nAccept: */*\r\n\r\n"))
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Read(make([]byte, 128)) // the server's greeting, then its close
		}
		_ = c.Close()
	}

	// The handshake deadline bounds how long a slot can stay taken.
	prompt := seqTokens(0, 16)
	seq := uint64(1)
	deadline := time.Now().Add(15 * time.Second)
	var pub zmq4.Socket
	var err error // the last dial's
	for ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9151"})[0] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a real publisher after %d failed handshakes never got through (last dial: %v): guard %+v",
				probes, err, l.GuardStats())
		}
		if pub == nil {
			pub = zmq4.NewPub(context.Background())
			if err = pub.Dial(endpoint(l)); err != nil {
				_ = pub.Close()
				pub = nil
				time.Sleep(50 * time.Millisecond)
				continue
			}
		}
		send(t, pub, "kv@127.0.0.1:9151@m", seq, batchPayload(t, vllmStored(anyHashes(1), nil, prompt, 16)))
		seq++
		time.Sleep(20 * time.Millisecond)
	}
	_ = l.Close()
	_ = pub.Close()
}
