package kvevents

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"
)

// noLeaks checks that no goroutine outlives the test, except the writer of
// the library's PUB socket, which the test's own publishers leave behind
// (the library does not stop it on Close; Sluice only subscribes).
//
// Nor the cluster client's topology refresh that a relay test's closed
// Redis Cluster client leaves sleeping for up to 5 s (rueidis ends it
// then; it holds no socket).
func noLeaks(t *testing.T) {
	goleak.VerifyNone(t, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

func resolveAll(pod string) (string, bool) { return pod, strings.HasPrefix(pod, "127.0.0.1:") }

// waitFor polls cond until it holds; the deadline only bounds a broken run.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newPub(t *testing.T, addr string) zmq4.Socket {
	t.Helper()
	pub := zmq4.NewPub(context.Background())
	if err := pub.Dial(addr); err != nil {
		t.Fatal(err)
	}
	return pub
}

func send(t *testing.T, pub zmq4.Socket, topic string, seq uint64, payload []byte) {
	t.Helper()
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if err := pub.SendMulti(zmq4.NewMsgFrom([]byte(topic), s[:], payload)); err != nil {
		t.Fatal(err)
	}
}

func TestListenerFeedsIndex(t *testing.T) {
	defer noLeaks(t)
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer l.Close()
	pub := newPub(t, endpoint(l))
	defer pub.Close()

	prompt := seqTokens(0, 32)
	topic := "kv@127.0.0.1:9150@m"
	// PUB drops messages until the subscription reaches it: resend a
	// removal of a block never stored (each a new sequence number) until
	// one lands, then store once (a store sent twice is two copies of the
	// block, which one removal would not take out).
	seq := uint64(1)
	waitFor(t, "the first batch", func() bool {
		send(t, pub, topic, seq, batchPayload(t, vllmRemoved(77)))
		seq++
		return ix.Stats().Batches > 0
	})
	send(t, pub, topic, seq, batchPayload(t, vllmStored(anyHashes(1, 2), nil, prompt, 16)))
	seq++
	waitFor(t, "the stored batch", func() bool {
		return ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9150"})[0] == 2
	})
	send(t, pub, topic, seq, batchPayload(t, vllmRemoved(2)))
	send(t, pub, "kv@10.9.9.9:1@m", 1, batchPayload(t, vllmRemoved(1))) // not a replica
	send(t, pub, topic, seq+1, []byte{0xc1})                            // malformed
	waitFor(t, "the removal and both drops", func() bool {
		s := ix.Stats()
		return s.Drops[ReasonUnknownPod] == 1 && s.Drops[ReasonMalformed] == 1 &&
			ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9150"})[0] == 1
	})
	if s := ix.Stats(); s.Replicas["127.0.0.1:9150"].LastEvent.IsZero() {
		t.Fatalf("no last event time: %+v", s)
	}
	// Close with a publisher still connected and sending: nothing leaks.
	for i := 0; i < 50; i++ {
		send(t, pub, topic, seq+2+uint64(i), batchPayload(t, vllmRemoved(9)))
	}
	if err := l.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	_ = pub.Close()
}

func TestListenerAddressErrors(t *testing.T) {
	ix := NewIndex(Config{})
	for _, addr := range []string{"127.0.0.1:5552", "ipc:///tmp/x", "tcp://127.0.0.1", "tcp://:5552", "tcp://127.0.0.1:99999", "tcp://127.0.0.1:-1"} {
		if l, err := Listen(ListenerConfig{Addr: addr, Index: ix, Resolve: resolveAll}); err == nil {
			l.Close()
			t.Errorf("%q: want an error", addr)
		} else if !strings.Contains(err.Error(), "kv_events") {
			t.Errorf("%q: error does not name the directive: %v", addr, err)
		}
	}
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer l.Close()
	if _, err := Listen(ListenerConfig{Addr: endpoint(l), Index: ix, Resolve: resolveAll}); err == nil ||
		!strings.Contains(err.Error(), "already listened on") {
		t.Fatalf("second listener on the same address: want already listened on, got %v", err)
	}
	// taken by something else
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyAddr := "tcp://" + busy.Addr().String()
	if _, err := Listen(ListenerConfig{Addr: busyAddr, Index: ix, Resolve: resolveAll}); err == nil || !strings.Contains(err.Error(), busyAddr) {
		t.Fatalf("busy port: %v", err)
	}
}

// Port 0 binds a free port, which Addr gives: each listener its own, and
// that port is then listened on (a second listener there is refused as
// one on a configured port is). Configuration still needs a port:
// engines must be told where to dial.
func TestListenerOnPortZero(t *testing.T) {
	defer noLeaks(t)
	ix := NewIndex(Config{})
	a := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer a.Close()
	b := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer b.Close()
	if pa, pb := portOf(a.Addr()), portOf(b.Addr()); pa == 0 || pb == 0 || pa == pb {
		t.Fatalf("two listeners on port 0 got ports %d and %d: want two distinct ports", pa, pb)
	}
	if _, err := Listen(ListenerConfig{Addr: endpoint(a), Index: ix, Resolve: resolveAll}); err == nil ||
		!strings.Contains(err.Error(), "already listened on") {
		t.Fatalf("a listener on the port 0 gave: want already listened on, got %v", err)
	}
	pub := newPub(t, endpoint(b))
	defer pub.Close()
	prompt := seqTokens(0, 16)
	seq := uint64(1)
	waitFor(t, "a publisher's event through the port 0 gave", func() bool {
		send(t, pub, "kv@127.0.0.1:9150@m", seq, batchPayload(t, vllmStored(anyHashes(1), nil, prompt, 16)))
		seq++
		return ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9150"})[0] == 1
	})
	_ = a.Close()
	_ = b.Close()
	_ = pub.Close()
	// Closed, its port is no longer taken for a listener.
	if _, taken := guardRegistry.Load(a.Addr().String()); taken {
		t.Fatalf("%s still registered after Close", a.Addr())
	}
	if _, err := ParseListenAddr(anyPort); err == nil {
		t.Fatal("a configured address of port 0: want an error")
	}
}

// zmtpGreeting is a ZMTP 3.0 NULL-mechanism greeting (64 bytes).
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}

// A hostile or broken client must not crash Sluice or stop real publishers:
// a frame announcing 2^40 bytes closes its connection; a client that never
// finishes its handshake is cut off at the deadline.
func TestListenerGuardsTheSocket(t *testing.T) {
	defer noLeaks(t)
	old := handshakeTimeout
	handshakeTimeout = 300 * time.Millisecond
	defer func() { handshakeTimeout = old }()

	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll})
	defer l.Close()

	silent, err := net.Dial("tcp", l.Addr().String()) // never speaks
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	huge, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer huge.Close()
	msg := zmtpGreeting()
	msg = append(msg, 0x06, 0, 0, 1, 0, 0, 0, 0, 0) // LONG|COMMAND, 2^40 bytes
	if _, err := huge.Write(msg); err != nil {
		t.Fatal(err)
	}
	_ = huge.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 256)
	for {
		if _, err := huge.Read(buf); err != nil {
			break // closed by the guard (or the deadline, which the next check catches)
		}
	}

	pub := newPub(t, endpoint(l))
	defer pub.Close()
	prompt := seqTokens(0, 16)
	seq := uint64(1)
	waitFor(t, "a real publisher after the hostile ones", func() bool {
		send(t, pub, "kv@127.0.0.1:9151@m", seq, batchPayload(t, vllmStored(anyHashes(1), nil, prompt, 16)))
		seq++
		return ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9151"})[0] == 1
	})
	// The silent one is cut at its deadline (the publisher did not wait
	// for it: each handshake runs on its own).
	waitFor(t, "the silent connection's handshake timeout", func() bool { return l.GuardStats().HandshakeTimeouts == 1 })
	if g := l.GuardStats(); g.OversizeFrames != 1 || g.HandshakeTimeouts != 1 {
		t.Fatalf("guard stats: %+v", g)
	}
	_ = l.Close()
	_ = pub.Close()
}
