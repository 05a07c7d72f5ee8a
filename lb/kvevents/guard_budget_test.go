package kvevents

import (
	"encoding/binary"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// The ZMQ library allocates a frame's announced size before its body
// comes. A client that announces a frame at the size limit and then sends
// nothing costs that much memory per connection, up to the connection
// limit (1,024 × 16 MiB by default) for a few hundred bytes each. The
// guard bounds what all connections of a listener may have announced and
// not yet handed over, and cuts the connections past it.
func TestListenerBoundsAnnouncedBytes(t *testing.T) {
	defer noLeaks(t)
	const payload = 1 << 20
	ix := NewIndex(Config{})
	l := listenAny(t, ListenerConfig{Index: ix, Resolve: resolveAll, Limits: Limits{MaxPayloadBytes: payload}})
	defer l.Close()

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 48
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		// The library's own handshake as a PUB, then a frame header
		// announcing payload bytes (LONG|MORE), and silence.
		if _, err := zmq4.Open(c, null.Security(), zmq4.Pub, nil, false, nil); err != nil {
			t.Fatalf("handshake %d: %v", i, err)
		}
		hdr := []byte{0x03, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(hdr[1:], payload)
		if _, err := c.Write(hdr); err != nil {
			t.Fatal(err)
		}
	}
	// At most about four messages of the size limit in progress.
	wantCut := uint64(n - 4*(payload+2*maxTopicBytes)/payload)
	// Bounded like waitFor's; the cuts come as the headers are read.
	deadline := time.Now().Add(20 * time.Second)
	for l.GuardStats().OversizeFrames < wantCut && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if g := l.GuardStats(); g.OversizeFrames < wantCut {
		t.Fatalf("%d connections announced %d MiB frames and stalled: %d cut (want >= %d), heap grew %d MiB",
			n, payload>>20, g.OversizeFrames, wantCut, grew>>20)
	}
	// A real publisher still gets through once the stalled ones are gone.
	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	pub := newPub(t, endpoint(l))
	defer pub.Close()
	prompt := seqTokens(0, 16)
	seq := uint64(1)
	waitFor(t, "a real publisher after the stalled ones", func() bool {
		send(t, pub, "kv@127.0.0.1:9151@m", seq, batchPayload(t, vllmStored(anyHashes(1), nil, prompt, 16)))
		seq++
		return ix.Match(ix.Keys(prompt), []string{"127.0.0.1:9151"})[0] == 1
	})
	_ = l.Close()
	_ = pub.Close()
}
