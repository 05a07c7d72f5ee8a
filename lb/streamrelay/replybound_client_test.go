package streamrelay

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The conn's bound holds only while it frames the replies as the client
// does: where the two part ways, the client reads as a length header
// bytes the conn counted as something else. clientView models how
// rueidis v1.0.79 reads what the conn passed (its reply reader in resp.go:
// which types it reads by length, which by line, which as fixed sizes),
// and these tests check the client never acts
// on more than the limit within one reply, nor on a header it would
// panic on or read without end, whatever the bytes.

// clientView is what the client does with b: the most one reply makes
// it hold (each string's length, 64 bytes per array element, each simple
// line as read), and the first thing it does wrong ("" when none).
func clientView(b []byte) (most int64, wrong string) {
	v := &clientReader{b: b}
	for {
		v.cost = 0
		done, wrong := v.message()
		most = max(most, v.cost)
		if wrong != "" || !done {
			return most, wrong
		}
	}
}

type clientReader struct {
	b    []byte
	pos  int
	cost int64
}

// need reports whether n more bytes are there; the client waits for them
// otherwise (and gets the conn's error).
func (v *clientReader) need(n int) bool { return len(v.b)-v.pos >= n }

// line is ReadSlice/ReadBytes('\n') from pos: the line, LF included.
func (v *clientReader) line() ([]byte, bool) {
	i := bytes.IndexByte(v.b[v.pos:], '\n')
	if i < 0 {
		return nil, false
	}
	l := v.b[v.pos : v.pos+i+1]
	v.pos += i + 1
	return l, true
}

// readI is rueidis's readI: ok false where the client waits or fails.
func (v *clientReader) readI() (n int64, chunked, ok bool) {
	bs, ok := v.line()
	if !ok || len(bs) < 3 {
		return 0, false, false
	}
	if bs[0] == '?' {
		return 0, true, true
	}
	s := int64(1)
	if bs[0] == '-' {
		s, bs = -1, bs[1:]
	}
	for _, c := range bs[:len(bs)-2] {
		d := int64(c - '0')
		if c < '0' || c > '9' {
			return 0, false, false
		}
		n = n*10 + d
	}
	return n * s, false, true
}

// message reads one message (attributes before it included): done false
// where the client waits or fails.
func (v *clientReader) message() (done bool, wrong string) {
	for {
		if !v.need(1) {
			return false, ""
		}
		typ := v.b[v.pos]
		v.pos++
		switch typ {
		case '$', '!', '=':
			n, chunked, ok := v.readI()
			switch {
			case !ok:
				return false, ""
			case chunked:
				return false, fmt.Sprintf("a streamed string read at %d", v.pos)
			case n == -1:
				return true, ""
			case n < 0:
				return false, fmt.Sprintf("make([]byte, %d) at %d: a panic", n, v.pos)
			}
			v.cost += n
			if !v.need(int(min(n, 1<<40)) + 2) {
				return false, ""
			}
			v.pos += int(n) + 2
			return true, ""
		case '+', '-', ',', '(':
			l, ok := v.line()
			if !ok || len(l) < 2 {
				return false, ""
			}
			v.cost += int64(len(l)) + 1
			return true, ""
		case ':':
			l, ok := v.line()
			if !ok || len(l) < 3 {
				return false, ""
			}
			v.cost += int64(len(l)) + 1
			return true, ""
		case '#':
			if !v.need(3) {
				return false, ""
			}
			v.pos += 3
			v.cost += 4
			return true, ""
		case '_', '.':
			if !v.need(2) {
				return false, ""
			}
			v.pos += 2
			v.cost += 3
			return true, ""
		case '*', '~', '>', '%', '|':
			n, chunked, ok := v.readI()
			switch {
			case !ok:
				return false, ""
			case chunked:
				return false, fmt.Sprintf("a streamed array read at %d", v.pos)
			case n == -1 && typ != '%' && typ != '|':
				return true, ""
			}
			if typ == '%' || typ == '|' {
				n *= 2
			}
			if n < 0 {
				return false, fmt.Sprintf("make([]RedisMessage, %d) at %d: a panic", n, v.pos)
			}
			v.cost += min(n, 1<<50) * elementBytes
			for range n {
				if done, wrong := v.message(); !done || wrong != "" {
					return false, wrong
				}
			}
			if typ != '|' {
				return true, ""
			}
			// An attribute: the message it annotates follows.
		default:
			return false, "" // the client fails: unknown type
		}
	}
}

// mutate changes b in a few random places, where the conn and the client
// could part ways: bytes after a boolean or null, a length's digits, its
// sign, a line end.
func mutate(r *rand.Rand, b []byte) []byte {
	b = slices.Clone(b)
	inserts := []string{"AA", "A", "\r", "\n", "\r\n", "$9999999", "*99999999", "%-1", "-5", "?", "#t", "_", "0", "9",
		"AA$99999999", "A*99999999", "\r\r$99999999", "A%-1", "AA*?"}
	for range 1 + r.IntN(3) {
		if len(b) == 0 {
			break
		}
		at := r.IntN(len(b))
		if r.IntN(3) == 0 {
			for i, c := range b {
				if c == '#' || c == '_' || c == '$' || c == '*' {
					if r.IntN(4) == 0 {
						at = i + 1 + r.IntN(2)
						break
					}
				}
			}
		}
		switch r.IntN(3) {
		case 0:
			at = min(at, len(b))
			b = slices.Insert(b, at, []byte(inserts[r.IntN(len(inserts))])...)
		case 1:
			at = min(at, len(b)-1)
			b[at] = "\r\n#_$*-?0123456789tA"[r.IntN(20)]
		case 2:
			at = min(at, len(b)-1)
			b = slices.Delete(b, at, at+1)
		}
	}
	return b
}

// checkClientView checks what the conn passed (got) as the client reads
// it. A boolean or null line refused at its LF has passed its first 4
// bytes at most, which the client reads as a whole boolean: slack enough
// for them.
func checkClientView(t testing.TB, in, got []byte, limit int64) {
	t.Helper()
	if most, wrong := clientView(got); wrong != "" || most > limit+fixedLine('#') {
		t.Fatalf("limit %d: the conn passed %q of %q; the client holds %d bytes of one reply, %s",
			limit, got, in, most, wrong)
	}
}

// Streams of replies, valid and mangled, read through the conn in pieces
// of any size: the client never holds more than the limit of one reply,
// nor reads a header it panics on or one without end.
func TestBoundedConnClientNeverActsOverTheLimit(t *testing.T) {
	for seed := range uint64(3000) {
		g := newRespGen(seed, seed%3 == 0)
		g.maxLen = 60
		valid := g.stream(1+g.r.IntN(4), g.r.IntN(4))
		in := mutate(g.r, valid)
		for _, limit := range []int64{int64(g.r.IntN(400)), 1 << 20} {
			for _, sizes := range [][]int{nil, {1}, {1 + g.r.IntN(9)}} {
				got, _ := readBounded(t, in, sizes, false, limit, 1+g.r.IntN(256))
				checkClientView(t, in, got, limit)
			}
		}
	}
}

// The client's view itself, on streams read by hand.
func TestClientView(t *testing.T) {
	for _, c := range []struct {
		in    string
		most  int64
		wrong bool
	}{
		{"+OK\r\n", 5, false},
		{"*2\r\n$3\r\nabc\r\n#t\r\n", 128 + 3 + 4, false},
		{"*2\r\n#tAA$1073741824\r\n", 128 + 4 + 1<<30, false},
		{"%-1\r\n", 0, true},
		{"$-5\r\n", 0, true},
		{"*?\r\n", 0, true},
		{"|1\r\n+a\r\n+b\r\n:1\r\n", 128 + 4 + 4 + 4, false},
	} {
		most, wrong := clientView([]byte(c.in))
		if most != c.most || (wrong != "") != c.wrong {
			t.Errorf("%q: holds %d, %q; want %d, wrong %v", c.in, most, wrong, c.most, c.wrong)
		}
	}
}
