package streamrelay

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Property and fuzz tests of boundedConn against a model of its rule
// written independently of it: a reply's cost is the sum of each simple
// line's length (type byte and CRLF included), each string's length,
// and 64 bytes per array element (two per map or attribute entry); it
// starts afresh with each top-level reply (attributes before one count
// toward it); the conn passes every reply within the limit unchanged and
// cuts the first that crosses it no later than the line end of the line
// that crosses.

// ---- generator of valid replies ----

// respGen appends random valid RESP3 (or, with resp2, RESP2) replies to
// buf.
type respGen struct {
	r      *rand.Rand
	resp2  bool
	maxLen int // of a string's payload
	buf    []byte
}

func newRespGen(seed uint64, resp2 bool) *respGen {
	return &respGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), resp2: resp2, maxLen: 300}
}

// stream appends n top-level replies back to back (a pipeline) and
// returns them.
func (g *respGen) stream(n, depth int) []byte {
	g.buf = g.buf[:0]
	for range n {
		g.reply(depth)
	}
	return slices.Clone(g.buf)
}

// reply appends one top-level reply: in RESP3 now and then a push.
func (g *respGen) reply(depth int) {
	if !g.resp2 && g.r.IntN(8) == 0 {
		g.attributes(depth)
		n := 1 + g.r.IntN(4)
		g.header('>', n)
		g.bulk('$', []byte([]string{"message", "invalidate", "pmessage"}[g.r.IntN(3)]))
		for range n - 1 {
			g.value(depth - 1)
		}
		return
	}
	g.value(depth)
}

func (g *respGen) header(typ byte, n int) {
	g.buf = append(g.buf, typ)
	g.buf = strconv.AppendInt(g.buf, int64(n), 10)
	g.buf = append(g.buf, "\r\n"...)
}

func (g *respGen) line(typ byte, s string) {
	g.buf = append(g.buf, typ)
	g.buf = append(g.buf, s...)
	g.buf = append(g.buf, "\r\n"...)
}

func (g *respGen) bulk(typ byte, p []byte) {
	g.header(typ, len(p))
	g.buf = append(g.buf, p...)
	g.buf = append(g.buf, "\r\n"...)
}

// attributes appends, in RESP3 and now and then, attributes that annotate
// the value to follow: one, sometimes two, sometimes empty.
func (g *respGen) attributes(depth int) {
	if g.resp2 || g.r.IntN(6) != 0 {
		return
	}
	for range 1 + g.r.IntN(2) {
		n := g.r.IntN(3)
		g.header('|', n)
		for range n {
			g.value(0)
			g.value(max(depth-1, 0))
		}
	}
}

// value appends one value nesting at most depth arrays deep.
func (g *respGen) value(depth int) {
	g.attributes(depth)
	kinds := "+-:_,#($!=$$$"
	if g.resp2 {
		kinds = "+-:$$$N"
	}
	if depth > 0 {
		if g.resp2 {
			kinds += "**n"
		} else {
			kinds += "**~%%n"
		}
	}
	switch k := kinds[g.r.IntN(len(kinds))]; k {
	case '+':
		g.line('+', g.text())
	case '-':
		g.line('-', "ERR "+g.text())
	case ':':
		g.line(':', strconv.FormatInt(g.r.Int64()>>g.r.IntN(64)*int64(1-2*g.r.IntN(2)), 10))
	case '_':
		g.line('_', "")
	case ',':
		ds := []string{"1.5", "-0", "inf", "-inf", "nan", "3.14e10", "0",
			strconv.FormatFloat(g.r.NormFloat64()*1e6, 'g', -1, 64)}
		g.line(',', ds[g.r.IntN(len(ds))])
	case '#':
		g.line('#', []string{"t", "f"}[g.r.IntN(2)])
	case '(':
		var s strings.Builder
		if g.r.IntN(2) == 0 {
			s.WriteByte('-')
		}
		s.WriteByte(byte('1' + g.r.IntN(9)))
		for range g.r.IntN(40) {
			s.WriteByte(byte('0' + g.r.IntN(10)))
		}
		g.line('(', s.String())
	case '$', '!':
		g.bulk(k, g.payload())
	case '=':
		g.bulk('=', append([]byte([]string{"txt:", "mkd:"}[g.r.IntN(2)]), g.payload()...))
	case 'N': // RESP2's null string
		g.buf = append(g.buf, "$-1\r\n"...)
	case 'n': // RESP2's null array
		g.buf = append(g.buf, "*-1\r\n"...)
	case '*', '~':
		n := g.count()
		g.header(k, n)
		for range n {
			g.value(depth - 1)
		}
	case '%':
		n := g.count()
		g.header('%', n)
		for range n {
			g.value(0)
			g.value(depth - 1)
		}
	}
}

func (g *respGen) count() int {
	switch g.r.IntN(6) {
	case 0:
		return 0
	case 1:
		return 5 + g.r.IntN(12)
	}
	return 1 + g.r.IntN(4)
}

// text is a simple string's content: no CR or LF.
func (g *respGen) text() string {
	const chars = "abcxyz019 $*%:+-_#,(=!|~>?.\t\x00\xff"
	b := make([]byte, g.r.IntN(3)*g.r.IntN(20))
	for i := range b {
		b[i] = chars[g.r.IntN(len(chars))]
	}
	return string(b)
}

// payload is a string's content: empty now and then, with CR, LF and
// what looks like a header inside.
func (g *respGen) payload() []byte {
	var n int
	switch g.r.IntN(8) {
	case 0:
		n = 0
	case 1:
		n = g.r.IntN(g.maxLen + 1)
	default:
		n = g.r.IntN(12)
	}
	pieces := []string{"\r", "\n", "\r\n", "*3\r\n", "$-1\r\n", "+OK\r\n", "|1\r\n", "x", "0", "\x00"}
	b := make([]byte, 0, n)
	for len(b) < n {
		if g.r.IntN(3) == 0 {
			b = append(b, pieces[g.r.IntN(len(pieces))]...)
		} else {
			b = append(b, byte(g.r.IntN(256)))
		}
	}
	return b[:n]
}

// ---- the model ----

// refLine is a line of a reply: a simple element, or the header of a
// string or an array.
type refLine struct {
	start, nl int   // offsets of its type byte and of its '\n'
	typ       byte  //
	cost      int64 // what it adds to its reply's cost
	str       []byte
	hasStr    bool // a string's header whose payload (str) is complete
}

type refReply struct {
	start int
	lines []refLine
}

// refStream is a stream as the model reads it: its replies, as far as
// valid ones go (the last maybe cut short), valid the length of its
// longest prefix of whole valid lines and strings, complete whether the
// whole stream is complete valid replies.
type refStream struct {
	replies  []refReply
	valid    int
	complete bool
}

const refMaxDepth = 16 // arrays the model follows nested (attributes included)

type refParser struct {
	b     []byte
	pos   int
	s     *refStream
	reply *refReply
}

// parseRef reads b as the model: strictly (lengths of 1 to 18 digits,
// "-1" only for a $ or *, no CR or LF inside a simple line, one byte in a
// boolean and none in a null, CRLF after each string).
func parseRef(b []byte) refStream {
	var s refStream
	p := &refParser{b: b, s: &s}
	for p.pos < len(b) {
		s.replies = append(s.replies, refReply{start: p.pos})
		p.reply = &s.replies[len(s.replies)-1]
		if !p.value(0) {
			return s
		}
	}
	s.complete = true
	return s
}

// line reads the line at pos; it adds it to the reply when valid.
func (p *refParser) line() (typ byte, content []byte, ok bool) {
	rest := p.b[p.pos:]
	nl := bytes.IndexByte(rest, '\n')
	if nl < 2 || rest[nl-1] != '\r' || bytes.IndexByte(rest[:nl-1], '\r') >= 0 {
		return 0, nil, false
	}
	return rest[0], rest[1 : nl-1], true
}

func (p *refParser) add(typ byte, cost int64) *refLine {
	nl := p.pos + bytes.IndexByte(p.b[p.pos:], '\n')
	p.reply.lines = append(p.reply.lines, refLine{start: p.pos, nl: nl, typ: typ, cost: cost})
	p.pos = nl + 1
	p.s.valid = p.pos
	return &p.reply.lines[len(p.reply.lines)-1]
}

// refLen reads a length: 1 to 18 digits, or -1 where null allows it.
func refLen(content []byte, null bool) (int64, bool) {
	if null && string(content) == "-1" {
		return -1, true
	}
	if len(content) == 0 || len(content) > 18 {
		return 0, false
	}
	var v int64
	for _, d := range content {
		if d < '0' || d > '9' {
			return 0, false
		}
		v = v*10 + int64(d-'0')
	}
	return v, true
}

// satCost is n elements of per bytes each, saturating far above any
// limit the tests use.
func satCost(n, per int64) int64 {
	const most = 1 << 60
	if n > most/per {
		return most
	}
	return n * per
}

func (p *refParser) value(depth int) bool {
	typ, content, ok := p.line()
	if !ok {
		return false
	}
	switch typ {
	case '#', '_': // the client reads them by count: "#t\r\n", "_\r\n"
		if len(content) != map[byte]int{'#': 1, '_': 0}[typ] {
			return false
		}
		p.add(typ, int64(len(content)+3))
		return true
	case '+', '-', ':', ',', '(':
		p.add(typ, int64(len(content)+3))
		return true
	case '$', '!', '=':
		n, ok := refLen(content, typ == '$')
		if !ok {
			return false
		}
		if n < 0 {
			p.add(typ, 0)
			return true
		}
		l := p.add(typ, n)
		if int64(len(p.b)-p.pos) < n+2 || string(p.b[p.pos+int(n):p.pos+int(n)+2]) != "\r\n" {
			return false
		}
		l.str, l.hasStr = p.b[p.pos:p.pos+int(n)], true
		p.pos += int(n) + 2
		p.s.valid = p.pos
		return true
	case '*', '~', '%', '>', '|':
		n, ok := refLen(content, typ == '*')
		if !ok || depth >= refMaxDepth {
			return false
		}
		if n < 0 {
			p.add(typ, 0)
			return true
		}
		per := int64(elementBytes)
		if typ == '%' || typ == '|' { // an entry is two elements
			per *= 2
		}
		p.add(typ, satCost(n, per))
		if typ == '%' || typ == '|' {
			n *= 2
		}
		for range n {
			if !p.value(depth + 1) {
				return false
			}
		}
		if typ == '|' { // it annotates the value that follows
			return p.value(depth)
		}
		return true
	}
	return false
}

// refCut is where the model says a stream under limit is cut: at line
// (of its reply) crossing the limit, keeping first; nil when no valid
// line crosses it.
type refCut struct {
	line  refLine
	first []string
}

func (s refStream) cut(limit int64) *refCut {
	for _, r := range s.replies {
		var cost int64
		var first []string
		for _, l := range r.lines {
			if cost = min(cost+l.cost, 1<<61); cost > limit {
				return &refCut{line: l, first: first}
			}
			if l.hasStr && len(first) < 3 {
				first = append(first, string(l.str[:min(len(l.str), 64)]))
			}
		}
	}
	return nil
}

// maxCost is the cost of the stream's costliest complete reply.
func (s refStream) maxCost() int64 {
	var most int64
	for _, r := range s.replies {
		var cost int64
		for _, l := range r.lines {
			cost += l.cost
		}
		most = max(most, cost)
	}
	return most
}

// ---- reading through a boundedConn ----

// chunkConn hands data over in chunks of the sizes given (cycled; all
// at once when none), the last with io.EOF when eofWithData.
type chunkConn struct {
	net.Conn    // nil: boundedConn calls Read only
	data        []byte
	sizes       []int
	i           int
	eofWithData bool
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.sizes) > 0 {
		n = c.sizes[c.i%len(c.sizes)]
		c.i++
	}
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	if len(c.data) == 0 && c.eofWithData {
		return n, io.EOF
	}
	return n, nil
}

// readBounded reads data through a boundedConn of limit over a
// chunkConn, with reads of bufSize, until the first error; it checks
// the error holds.
func readBounded(t testing.TB, data []byte, sizes []int, eofWithData bool, limit int64, bufSize int) ([]byte, error) {
	t.Helper()
	c := &boundedConn{Conn: &chunkConn{data: data, sizes: sizes, eofWithData: eofWithData}, limit: limit}
	var got []byte
	buf := make([]byte, bufSize)
	for zero := 0; ; zero++ {
		n, err := c.Read(buf)
		if n < 0 || n > len(buf) {
			t.Fatalf("Read returned %d of a %d-byte buffer", n, len(buf))
		}
		got = append(got, buf[:n]...)
		if err != nil {
			if n2, err2 := c.Read(buf); n2 != 0 || (asCut(err) != nil && err2 != err) {
				t.Fatalf("Read after %v: %d, %v", err, n2, err2)
			}
			return got, err
		}
		if n > 0 {
			zero = 0
		} else if zero > 100 {
			t.Fatalf("100 reads of nothing without an error")
		}
	}
}

// checkBounded checks what a boundedConn of limit passed of in (got,
// then err) against the model.
func checkBounded(t testing.TB, in []byte, s refStream, limit int64, got []byte, err error) {
	t.Helper()
	if !bytes.HasPrefix(in, got) {
		t.Fatalf("limit %d: passed %q, not a prefix of the input %q", limit, got, in)
	}
	want := s.cut(limit)
	if want == nil {
		if len(got) < s.valid {
			t.Fatalf("limit %d: passed %d bytes (%v) of a stream valid for %d, no reply over the limit: %q",
				limit, len(got), err, s.valid, in)
		}
		if s.complete && (len(got) != len(in) || err != io.EOF) {
			t.Fatalf("limit %d: passed %d bytes of %d, then %v; want all of it, then EOF: %q",
				limit, len(got), len(in), err, in)
		}
		return
	}
	l := want.line
	cut := asCut(err)
	if cut == nil || cut.limit != limit {
		t.Fatalf("limit %d: passed %d bytes, then %v; want a cut at the line at %d (%q): %q",
			limit, len(got), err, l.start, in[l.start:l.nl+1], in)
	}
	header := strings.IndexByte("$!=*~%>|", l.typ) >= 0
	if len(got) > l.nl || len(got) < l.start || (header && len(got) != l.nl) {
		t.Fatalf("limit %d: cut after %d bytes; want it at the line end (%d) of the line at %d (%q), and after the line's start: %q",
			limit, len(got), l.nl, l.start, in[l.start:l.nl+1], in)
	}
	if !slices.Equal(cut.first, want.first) && (len(cut.first) != 0 || len(want.first) != 0) {
		t.Fatalf("limit %d: the cut kept %q, want %q: %q", limit, cut.first, want.first, in)
	}
}

// chunkings are ways to split s into reads: whole, a byte at a time, of
// random sizes, and at the awkward places of its lines (inside a CRLF,
// after a type byte, inside a length).
func chunkings(r *rand.Rand, in []byte, s refStream) [][]int {
	out := [][]int{nil, {1}, {2}, {3}, {1 + r.IntN(7), 1 + r.IntN(30), 1 + r.IntN(200)}}
	var cuts []int
	for _, rp := range s.replies {
		for _, l := range rp.lines {
			for _, at := range []int{l.nl, l.nl - 1, l.start + 1, l.start + 2} {
				if at > 0 && at < len(in) && r.IntN(2) == 0 {
					cuts = append(cuts, at)
				}
			}
		}
	}
	slices.Sort(cuts)
	var sizes []int
	prev := 0
	for _, at := range slices.Compact(cuts) {
		if at > prev {
			sizes, prev = append(sizes, at-prev), at
		}
	}
	if len(sizes) > 0 {
		out = append(out, append(sizes, len(in)))
	}
	return out
}

// ---- the properties ----

// Under a limit as large as the costliest reply, or larger, every stream
// of valid replies passes through unchanged, however its reads split.
func TestBoundedConnPassesValidStreams(t *testing.T) {
	for seed := range uint64(800) {
		g := newRespGen(seed, seed%3 == 0)
		in := g.stream(1+g.r.IntN(6), g.r.IntN(5))
		s := parseRef(in)
		if !s.complete || s.valid != len(in) {
			t.Fatalf("seed %d: the model reads the generated stream as invalid after %d bytes: %q", seed, s.valid, in)
		}
		for _, sizes := range chunkings(g.r, in, s) {
			for _, limit := range []int64{s.maxCost(), 1 << 40} {
				got, err := readBounded(t, in, sizes, g.r.IntN(2) == 0, limit, 1+g.r.IntN(1<<12))
				if !bytes.Equal(got, in) || err != io.EOF {
					t.Fatalf("seed %d, limit %d, reads of %v: passed %q, then %v; want %q, then EOF",
						seed, limit, sizes, got, err, in)
				}
			}
		}
	}
}

// The same over a net.Pipe, written in random pieces.
func TestBoundedConnPassesValidStreamsOverAPipe(t *testing.T) {
	for seed := range uint64(100) {
		g := newRespGen(seed, false)
		in := g.stream(1+g.r.IntN(6), 4)
		server, client := net.Pipe()
		go func(r *rand.Rand) {
			defer server.Close()
			for rest := in; len(rest) > 0; {
				n := min(len(rest), 1+r.IntN(9))
				if _, err := server.Write(rest[:n]); err != nil {
					return
				}
				rest = rest[n:]
			}
		}(rand.New(rand.NewPCG(seed, 1)))
		c := &boundedConn{Conn: client, limit: parseRef(in).maxCost()}
		got, err := io.ReadAll(c)
		client.Close()
		if err != nil || !bytes.Equal(got, in) {
			t.Fatalf("seed %d: passed %q, %v; want %q", seed, got, err, in)
		}
	}
}

// Under a small limit, the replies within it pass and the first over it
// is cut at the line that crosses it, keeping its first strings.
func TestBoundedConnCutsAtTheCrossingLine(t *testing.T) {
	for seed := range uint64(500) {
		g := newRespGen(seed, seed%3 == 0)
		g.maxLen = 100
		in := g.stream(1+g.r.IntN(6), g.r.IntN(5))
		s := parseRef(in)
		// Limits at the edges: each reply's cost, one less, each line's
		// running cost and one less, and random ones.
		limits := []int64{0, 1, int64(g.r.IntN(int(s.maxCost()) + 1))}
		for _, r := range s.replies {
			var cost int64
			for _, l := range r.lines {
				cost += l.cost
				if g.r.IntN(3) == 0 {
					limits = append(limits, cost, cost-1)
				}
			}
			limits = append(limits, cost, cost-1)
		}
		g.r.Shuffle(len(limits)-3, func(i, j int) { limits[3+i], limits[3+j] = limits[3+j], limits[3+i] })
		for _, limit := range limits[:min(len(limits), 10)] {
			if limit < 0 {
				continue
			}
			for _, sizes := range chunkings(g.r, in, s) {
				got, err := readBounded(t, in, sizes, g.r.IntN(2) == 0, limit, 1+g.r.IntN(1<<12))
				checkBounded(t, in, s, limit, got, err)
			}
		}
	}
}

// The count starts afresh with each reply: hundreds of replies, together
// far over the limit, each within it, all pass.
func TestBoundedConnCountsEachReplyAlone(t *testing.T) {
	g := newRespGen(7, false)
	in := g.stream(400, 3)
	s := parseRef(in)
	var total int64
	for _, r := range s.replies {
		for _, l := range r.lines {
			total += l.cost
		}
	}
	limit := s.maxCost()
	if total < 20*limit {
		t.Fatalf("the replies cost %d together, at most %d each: not enough for the test", total, limit)
	}
	for _, sizes := range [][]int{nil, {1}, {5, 3}} {
		if got, err := readBounded(t, in, sizes, false, limit, 512); !bytes.Equal(got, in) || err != io.EOF {
			t.Fatalf("reads of %v: passed %d bytes of %d, then %v", sizes, len(got), len(in), err)
		}
	}
}

// A length header declaring more than the limit is cut however large its
// length: before, 2^58 array elements (2^64 bytes at 64 each) counted 0,
// and a map's 2^57 entries too, so the client was told to allocate them.
func TestBoundedConnCutsHugeLengths(t *testing.T) {
	for _, in := range []string{
		"*288230376151711744\r\n",  // 2^58 elements: 2^64 bytes
		"%144115188075855872\r\n",  // 2^57 entries: 2^64 bytes
		"*144115188075855873\r\n",  // 2^63 + 64 bytes: negative
		"~288230376151711745\r\n",  // 2^64 + 64 bytes
		"|2305843009213693952\r\n", // 2^61 entries
		"*4611686018427387909\r\n", // the largest length read
		"%4611686018427387909\r\n",
		"$4611686018427387909\r\n",
		"*2\r\n:1\r\n*288230376151711744\r\n",
	} {
		for _, limit := range []int64{1 << 20, 1 << 62} {
			got, err := readBounded(t, []byte(in), []int{1}, false, limit, 64)
			if asCut(err) == nil || len(got) != len(in)-1 {
				t.Errorf("%q under %d: passed %q, then %v; want all but its LF, then a cut", in, limit, got, err)
			}
		}
	}
}

// A header read in pieces counts as the whole: a reply within the limit
// is not cut because the line of a header of its own reaches past it.
// Before, "$0\r" counted 3 bytes (the whole "$0\r\n" counts 0), and the
// reply below, costing exactly the limit, was cut when its last header
// came split.
func TestBoundedConnSplitHeaderWithinTheLimit(t *testing.T) {
	in := []byte("*2\r\n$34\r\n" + strings.Repeat("x", 34) + "\r\n$0\r\n\r\n*0\r\n*-1\r\n$-1\r\n")
	const limit = 2*64 + 34 // the first reply's cost
	for _, sizes := range [][]int{nil, {1}, {len(in) - 10, 1}} {
		if got, err := readBounded(t, in, sizes, false, limit, 64); !bytes.Equal(got, in) || err != io.EOF {
			t.Errorf("reads of %v: passed %q, then %v; want %q, then EOF", sizes, got, err, in)
		}
	}
	// A header line longer than any length fails, split or whole.
	long := []byte("*" + strings.Repeat("0", 100) + "1\r\n:1\r\n")
	for _, sizes := range [][]int{nil, {1}} {
		got, err := readBounded(t, long, sizes, false, 1<<20, 64)
		if err == nil || err == io.EOF || asCut(err) != nil || len(got) > bytes.IndexByte(long, '\n') {
			t.Errorf("a %d-byte header, reads of %v: passed %d bytes, then %v; want an error before its LF",
				len(long), sizes, len(got), err)
		}
	}
}

// An empty attribute annotates the element that follows and completes
// nothing (the client reads it so). Before, it counted as an element:
// the array below ended a line early for the conn, whose count started
// afresh at "$10", letting the reply pass 1 byte over the limit.
func TestBoundedConnEmptyAttribute(t *testing.T) {
	in := []byte("*2\r\n|0\r\n:1\r\n$10\r\n0123456789\r\n")
	const cost = 2*64 + 4 + 10
	s := parseRef(in)
	if !s.complete || len(s.replies) != 1 || s.maxCost() != cost {
		t.Fatalf("the model reads %q as %+v", in, s)
	}
	for _, limit := range []int64{cost, cost - 1} {
		for _, sizes := range [][]int{nil, {1}} {
			got, err := readBounded(t, in, sizes, false, limit, 64)
			checkBounded(t, in, s, limit, got, err)
		}
	}
}

// A map or attribute of length -1 (RESP2's null is for strings and
// arrays only) is refused before its line end: the client would size a
// slice of -2 for it (rueidis's readMap) and panic. Before, it passed as
// an empty one.
func TestBoundedConnRefusesNullMaps(t *testing.T) {
	for _, in := range []string{"%-1\r\n", "|-1\r\n:1\r\n", "*1\r\n%-1\r\n"} {
		for _, sizes := range [][]int{nil, {1}} {
			got, err := readBounded(t, []byte(in), sizes, false, 1<<20, 64)
			if err == nil || err == io.EOF || asCut(err) != nil || len(got) > strings.LastIndex(in, "-1\r\n")+3 {
				t.Errorf("%q, reads of %v: passed %q, then %v; want an error before the LF of its -1", in, sizes, got, err)
			}
		}
	}
}

// ---- the fuzz target ----

// FuzzBoundedConn reads any bytes through a boundedConn, in reads split
// as chunks says, under limit and under a limit far larger: it never
// panics, passes only a prefix of its input, and what the model claims
// of the input's valid part holds: a stream of valid replies passes
// whole under the large limit, the replies within the limit pass, and
// the first over it is cut no later than the line crossing it; and the
// client, reading what passed, holds no more than the limit of a reply
// (replybound_client_test.go).
func FuzzBoundedConn(f *testing.F) {
	for seed := range uint64(40) {
		g := newRespGen(seed, seed%4 == 0)
		g.maxLen = 80
		in := g.stream(1+g.r.IntN(4), g.r.IntN(4))
		f.Add(in, uint32(g.r.IntN(int(parseRef(in).maxCost())+2)), []byte{byte(seed)})
	}
	f.Add([]byte("*288230376151711744\r\n:1\r\n"), uint32(1<<20), []byte{})
	f.Add([]byte("*2\r\n|0\r\n:1\r\n$10\r\n0123456789\r\n"), uint32(141), []byte{0})
	f.Add([]byte("*2\r\n$34\r\n"+strings.Repeat("x", 34)+"\r\n$0\r\n\r\n"), uint32(162), []byte{0})
	f.Add([]byte("*2\r\n#tAA$4611686018427387909\r\n"), uint32(1<<20), []byte{})
	f.Fuzz(func(t *testing.T, in []byte, limit uint32, chunks []byte) {
		var sizes []int
		for _, c := range chunks {
			sizes = append(sizes, 1+int(c)%48)
		}
		s := parseRef(in)
		for _, lim := range []int64{int64(limit), 1 << 40} {
			got, err := readBounded(t, in, sizes, len(chunks)%2 == 1, lim, 1+len(in)%4096)
			checkBounded(t, in, s, lim, got, err)
			checkClientView(t, in, got, lim)
		}
	})
}

// The model itself: a few streams read by hand.
func TestRefModel(t *testing.T) {
	for _, c := range []struct {
		in       string
		costs    []int64
		complete bool
	}{
		{"+OK\r\n", []int64{5}, true},
		{"*2\r\n$1\r\na\r\n%1\r\n_\r\n,1.5\r\n", []int64{128, 1, 128, 3, 6}, true},
		{"|1\r\n+k\r\n+v\r\n:1\r\n", []int64{128, 4, 4, 4}, true},
		{"*-1\r\n$-1\r\n*0\r\n", []int64{0, 0, 0}, true},
		{"$3\r\nab\r\n", []int64{3}, false},
		{"*2\r\n:1\r\n", []int64{128, 4}, false},
		{"+a\rb\r\n", nil, false},
	} {
		s := parseRef([]byte(c.in))
		var costs []int64
		for _, r := range s.replies {
			for _, l := range r.lines {
				costs = append(costs, l.cost)
			}
		}
		if !slices.Equal(costs, c.costs) || s.complete != c.complete {
			t.Errorf("%q: costs %v, complete %v; want %v, %v", c.in, costs, s.complete, c.costs, c.complete)
		}
	}
	if n := len(parseRef([]byte("+a\r\n:1\r\n*1\r\n*1\r\n_\r\n")).replies); n != 3 {
		t.Errorf("3 replies read as %d", n)
	}
}

// A boolean is 4 bytes to the client and a null 3 (rueidis's readBoolean
// and readNull take the bytes after the type byte by count, not up to a
// line end), so a longer line of either type is refused before its LF.
// Before, the conn counted "#tAA$4611686018427387909\r\n" as one simple
// line of 26 bytes and passed it, while the client read "#tAA", a
// boolean, then "$4611686018427387909", the header of a string, and
// sized it: a reply through a 1 MiB bound made it allocate 1 GiB with
// "$1073741824", and panic (makeslice: len out of range) with this one.
func TestBoundedConnFixedSizeBooleanAndNull(t *testing.T) {
	for _, in := range []string{
		"*2\r\n#tAA$4611686018427387909\r\n",
		"#tAA*288230376151711744\r\n",
		"*2\r\n_AA$1073741824\r\n",
		"_\r\r*4611686018427387909\r\n",
		"#\r\n+OK\r\n",  // the client takes '\r' for the value and "\n+" after it
		"*1\r\n#tt\r\n", // 5 bytes
	} {
		lf := strings.IndexByte(in, '#')
		if u := strings.IndexByte(in, '_'); lf < 0 || (u >= 0 && u < lf) {
			lf = u
		}
		lf += strings.IndexByte(in[lf:], '\n')
		for _, sizes := range [][]int{nil, {1}} {
			got, err := readBounded(t, []byte(in), sizes, false, 1<<20, 64)
			if err == nil || err == io.EOF || len(got) > lf {
				t.Errorf("%q, reads of %v: passed %q, then %v; want an error before the LF of its boolean or null",
					in, sizes, got, err)
			}
		}
	}
	// The lines the client reads so pass.
	in := []byte("*4\r\n#t\r\n#f\r\n_\r\n%1\r\n_\r\n#t\r\n")
	for _, sizes := range [][]int{nil, {1}} {
		if got, err := readBounded(t, in, sizes, false, 1<<20, 64); !bytes.Equal(got, in) || err != io.EOF {
			t.Errorf("reads of %v: passed %q, then %v; want %q, then EOF", sizes, got, err, in)
		}
	}
}
