package streamrelay

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
)

// The client (rueidis) parses a whole reply before handing it over, and
// sizes each string and array from its header: a stream entry of any size
// (Redis takes 512 MB a value, and any number of fields) would be held in
// full, and XREAD COUNT n holds n of them. It has no limit of its own, so
// the relay's connections watch the replies as they arrive and cut one
// before the header that would take it over the relay's ReadBytes.

// elementBytes is what the relay counts for each element of an array:
// the client's parsed message (40 bytes) and the field map the relay
// builds from it.
const elementBytes = 64

const (
	maxHeaderBytes = 64 // a length header is a type byte, at most 20 digits and CRLF
	maxDepth       = 32 // a stream reply nests 5 deep
	keptStrings    = 3  // strings a cut keeps: key and first id (XREAD), first id (XREVRANGE)
	keptStringMax  = 64 // bytes kept of each: an id is at most 41
)

// replyCut is the error of a reply cut for its size. The connection is
// then dropped (the client redials), the rest of the reply unread.
type replyCut struct {
	limit int64
	// first are the reply's first strings, as far as it got (up to
	// keptStrings, each cut to keptStringMax bytes): the stream key and
	// the first entry's id of an XREAD, the first id of an XREVRANGE.
	first []string
}

func (e *replyCut) Error() string {
	return fmt.Sprintf("streamrelay: a Redis reply over %d bytes was cut", e.limit)
}

// asCut returns the cut err is, or nil.
func asCut(err error) *replyCut {
	var cut *replyCut
	if errors.As(err, &cut) {
		return cut
	}
	return nil
}

// string returns the i-th string of the cut reply, if it got that far.
func (e *replyCut) string(i int) (string, bool) {
	if i < len(e.first) {
		return e.first[i], true
	}
	return "", false
}

// dialBounded dials as the client would and bounds the connection's
// replies to limit bytes.
func dialBounded(limit int64) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	return func(ctx context.Context, addr string, d *net.Dialer, tc *tls.Config) (net.Conn, error) {
		var c net.Conn
		var err error
		if tc != nil {
			c, err = (&tls.Dialer{NetDialer: d, Config: tc}).DialContext(ctx, "tcp", addr)
		} else {
			c, err = d.DialContext(ctx, "tcp", addr)
		}
		if err != nil {
			return nil, err
		}
		return &boundedConn{Conn: c, limit: limit}, nil
	}
}

// boundedConn passes Redis's replies (RESP2 or RESP3) through unchanged,
// counting what the client will allocate for the reply under way: each
// string's length, each simple line's, elementBytes per array element. A
// header that would take the count over limit is held back (without its
// line end the client cannot act on it) and the read fails with a
// replyCut. It must frame the replies as the client does (a line the two
// would read differently, a boolean longer than the client takes, say,
// fails the read). Reads come from the client's one reader goroutine.
type boundedConn struct {
	net.Conn
	limit int64

	cost    int64   // of the reply under way
	open    []frame // its arrays (maps, sets, ...) not yet complete
	header  []byte  // the line being read (its first maxHeaderBytes)
	lineLen int64   // its length so far
	body    int64   // bytes of the string under way left, CRLF included
	keep    []byte  // of the string under way, when kept
	keeping bool
	first   []string // the reply's first strings (replyCut.first)
	err     error    // once cut, every read fails
}

// frame is an open array: elements left, and whether it is an attribute
// (it annotates the element that follows, and completes nothing).
type frame struct {
	left int64
	attr bool
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if ok, serr := c.scan(p[:n]); serr != nil {
		c.err = serr
		if ok == 0 {
			return 0, serr
		}
		return ok, nil // the cut comes with the next read
	}
	return n, err
}

// scan follows the replies through b and returns how much of b may pass:
// all of it, or up to the line end of the header it stops at.
func (c *boundedConn) scan(b []byte) (int, error) {
	for i := 0; i < len(b); {
		if c.body > 0 {
			k := int(min(c.body, int64(len(b)-i)))
			if c.keeping {
				c.keep = append(c.keep, b[i:i+min(k, keptStringMax+2-len(c.keep))]...)
			}
			i += k
			c.body -= int64(k)
			if c.body == 0 {
				c.stringDone()
			}
			continue
		}
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			c.addLine(b[i:])
			if err := c.partLine(); err != nil {
				return i, err
			}
			break
		}
		c.addLine(b[i : i+j+1])
		if err := c.endLine(); err != nil {
			return i + j, err
		}
		i += j + 1
	}
	return len(b), nil
}

func (c *boundedConn) addLine(b []byte) {
	c.header = append(c.header, b[:min(len(b), maxHeaderBytes-len(c.header))]...)
	c.lineLen += int64(len(b))
}

// partLine checks the line under way, its end not yet read. A simple
// line past the limit is cut now (the client buffers it whole), and a
// boolean or null as long as the client reads it fails (fixedLine). A
// header's own bytes count nothing (its length counts, at its end, and
// the line may yet end within the limit), but one longer than any length
// header fails.
func (c *boundedConn) partLine() error {
	switch typ := c.header[0]; typ {
	case '$', '!', '=', '*', '~', '>', '%', '|':
		if c.lineLen > maxHeaderBytes {
			return errHeaderTooLong
		}
		return nil
	case '#', '_':
		if c.lineLen >= fixedLine(typ) { // the client has read it whole, and no LF came
			return errFixedLine(typ)
		}
	}
	if c.lineLen > c.limit-c.cost {
		return c.cut()
	}
	return nil
}

var errHeaderTooLong = errors.New("streamrelay: a Redis reply header too long")

// fixedLine is the length of a line of type typ as the client reads it,
// CRLF included, whatever its bytes: rueidis takes a boolean's and a
// null's bytes after the type byte by count (readBoolean, readNull), not
// up to a line end. A longer line would put the client and the conn out
// of step: what follows the first bytes, a length header say, is the
// next element to the client, and part of this line to the conn.
func fixedLine(typ byte) int64 {
	if typ == '#' {
		return 4 // "#t\r\n"
	}
	return 3 // "_\r\n"
}

func errFixedLine(typ byte) error {
	return fmt.Errorf("streamrelay: a Redis reply line of type %q not %d bytes long", typ, fixedLine(typ))
}

// endLine takes the line just read: a header, or a whole simple element.
func (c *boundedConn) endLine() error {
	line, n := c.header, c.lineLen
	c.header, c.lineLen = c.header[:0], 0
	if n < 3 {
		return errors.New("streamrelay: a Redis reply line without type or CRLF")
	}
	switch typ := line[0]; typ {
	case '#', '_':
		if n != fixedLine(typ) {
			return errFixedLine(typ)
		}
		fallthrough
	case '+', '-', ':', ',', '(':
		if n > c.limit-c.cost {
			return c.cut()
		}
		c.cost += n
		c.elementDone()
	case '$', '!', '=':
		size, err := headerLen(line, n)
		if err != nil || size < 0 {
			if err == nil { // RESP2's null string
				c.elementDone()
			}
			return err
		}
		if size > c.limit-c.cost {
			return c.cut()
		}
		c.cost += size
		c.body = size + 2
		c.keeping = len(c.first) < keptStrings
		c.keep = c.keep[:0]
	case '*', '~', '>', '%', '|':
		size, err := headerLen(line, n)
		if err != nil {
			return err
		}
		per := int64(elementBytes)
		if typ == '%' || typ == '|' { // an entry is two elements
			if size < 0 { // no null map: the client would size a slice of -2
				return fmt.Errorf("streamrelay: a Redis reply of type %q and length -1", typ)
			}
			per *= 2
		}
		if size <= 0 { // empty, or RESP2's null array
			if typ != '|' { // an attribute, even empty, annotates the element that follows
				c.elementDone()
			}
			return nil
		}
		// Compared before multiplying: a length of 2^58 elements would
		// count 2^64 bytes, 0 in an int64.
		if size > (c.limit-c.cost)/per {
			return c.cut()
		}
		c.cost += size * per
		size *= per / elementBytes
		if len(c.open) == maxDepth {
			return errors.New("streamrelay: a Redis reply nested too deep")
		}
		c.open = append(c.open, frame{left: size, attr: typ == '|'})
	default:
		// Streamed strings and arrays ('?' lengths, ';' chunks), which
		// Redis does not send, included.
		return fmt.Errorf("streamrelay: unexpected Redis reply type %q", typ)
	}
	return nil
}

// headerLen reads the length of a string or array header (n bytes long,
// line its first bytes).
func headerLen(line []byte, n int64) (int64, error) {
	if n > maxHeaderBytes {
		return 0, errHeaderTooLong
	}
	if line[len(line)-2] != '\r' {
		return 0, errors.New("streamrelay: a Redis reply header without CRLF")
	}
	digits := line[1 : len(line)-2]
	if string(digits) == "-1" {
		return -1, nil
	}
	var v int64
	for _, d := range digits {
		if d < '0' || d > '9' || v > (1<<62)/10 {
			return 0, fmt.Errorf("streamrelay: a Redis reply length %q (streamed replies are not read)", digits)
		}
		v = v*10 + int64(d-'0')
	}
	if len(digits) == 0 {
		return 0, errors.New("streamrelay: a Redis reply length missing")
	}
	return v, nil
}

func (c *boundedConn) stringDone() {
	if c.keeping {
		s := c.keep[:max(len(c.keep)-2, 0)] // without the CRLF
		c.first = append(c.first, string(s[:min(len(s), keptStringMax)]))
		c.keeping = false
	}
	c.elementDone()
}

// elementDone closes the arrays an element completes, and the reply when
// it completes one at the top.
func (c *boundedConn) elementDone() {
	for len(c.open) > 0 {
		top := &c.open[len(c.open)-1]
		if top.left--; top.left > 0 {
			return
		}
		attr := top.attr
		c.open = c.open[:len(c.open)-1]
		if attr {
			return
		}
	}
	c.cost, c.first = 0, c.first[:0]
}

func (c *boundedConn) cut() error {
	return &replyCut{limit: c.limit, first: c.first}
}
