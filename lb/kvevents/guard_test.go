package kvevents

import (
	"bytes"
	"net"
	"testing"
)

func newScanner(maxFrame int64) *guardConn {
	a, _ := net.Pipe()
	return &guardConn{Conn: a, lim: guardLimits{maxFrame: maxFrame, maxMessage: 2 * maxFrame, maxFrames: 3}, greeting: 64}
}

func TestGuardScan(t *testing.T) {
	short := func(flags byte, body []byte) []byte { return append([]byte{flags, byte(len(body))}, body...) }
	long := func(flags byte, size int) []byte {
		return []byte{flags | 0x02, 0, 0, 0, 0, byte(size >> 24), byte(size >> 16), byte(size >> 8), byte(size)}
	}
	msg := append(zmtpGreeting(), short(0x04, []byte("\x05READY"))...)
	msg = append(msg, short(0x01, []byte("kv@h:1@m"))...)
	msg = append(msg, short(0x01, make([]byte, 8))...)
	msg = append(msg, long(0, 300)...)
	msg = append(msg, bytes.Repeat([]byte{0x90}, 300)...)
	// a well-formed stream passes, whole or a byte at a time
	if err := newScanner(1000).scan(msg); err != nil {
		t.Fatalf("whole: %v", err)
	}
	c := newScanner(1000)
	for i := range msg {
		if err := c.scan(msg[i : i+1]); err != nil {
			t.Fatalf("byte %d: %v", i, err)
		}
	}
	if !c.shaken.Load() {
		t.Fatal("the handshake command was not seen")
	}
	bad := map[string][]byte{
		"frame over the limit":   append(zmtpGreeting(), long(0, 1001)...),
		"2^63 bytes":             append(zmtpGreeting(), 0x02, 0x80, 0, 0, 0, 0, 0, 0, 0),
		"too many frames":        append(append(append(append(zmtpGreeting(), short(1, nil)...), short(1, nil)...), short(1, nil)...), short(1, nil)...),
		"message over the limit": append(append(append(append(append(zmtpGreeting(), long(1, 900)...), make([]byte, 900)...), long(1, 900)...), make([]byte, 900)...), long(0, 900)...),
	}
	for name, b := range bad {
		if err := newScanner(1000).scan(b); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}
