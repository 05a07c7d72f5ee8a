package kvevents

import (
	"encoding/binary"
	"net"
	"syscall"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/sluice-router/sluice/lb"
)

// Test payload builders: what engines put on the wire, encoded with the
// same msgpack library the publisher in llm-d-inference-sim uses.

func pack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// seqTokens returns n token ids starting at from.
func seqTokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func anyTokens(ts []uint32) []any {
	out := make([]any, len(ts))
	for i, v := range ts {
		out[i] = v
	}
	return out
}

func anyHashes(hs ...uint64) []any {
	out := make([]any, len(hs))
	for i, v := range hs {
		out[i] = v
	}
	return out
}

// vllmStored is vLLM's positional BlockStored (array_like, tag first).
func vllmStored(hashes []any, parent any, tokens []uint32, blockSize int) []any {
	return []any{"BlockStored", hashes, parent, anyTokens(tokens), blockSize, nil, "GPU"}
}

func vllmRemoved(hashes ...uint64) []any {
	return []any{"BlockRemoved", anyHashes(hashes...), "GPU"}
}

func batchPayload(t testing.TB, events ...any) []byte {
	return pack(t, []any{1.5, events, 0})
}

func frames(topic string, seq uint64, payload []byte) [][]byte {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	return [][]byte{[]byte(topic), s[:], payload}
}

func mustMessage(t testing.TB, topic string, seq uint64, payload []byte) Message {
	t.Helper()
	m, err := DecodeMessage(frames(topic, seq, payload), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// preq is a parsed completion request for text.
func preq(text string) *lb.Request { return &lb.Request{Model: "m", Text: text, Parsed: true} }

// Ports: every test binds port 0 and reads back what it got, so two runs
// of the package on one machine (CI and a developer, two checkouts) never
// meet on a port.

// anyPort asks Listen for a free loopback port.
const anyPort = "tcp://127.0.0.1:0"

// listenAny is Listen on a free loopback port (cfg.Addr is ignored).
func listenAny(t testing.TB, cfg ListenerConfig) *Listener {
	t.Helper()
	cfg.Addr = anyPort
	l, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// endpoint is where a publisher dials l.
func endpoint(l *Listener) string { return "tcp://" + l.Addr().String() }

// portOf is the port of a bound TCP address.
func portOf(a net.Addr) int { return a.(*net.TCPAddr).Port }

// freePort is a loopback port that was free a moment ago, for a process
// that must be told its port (the sim's HTTP server); whatever Sluice's
// code binds binds port 0 instead.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return portOf(ln.Addr())
}

// refusingPort is a loopback port held (bound, never listening) until the
// test ends: a connection to it is refused, and nothing else can take it.
func refusingPort(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}
