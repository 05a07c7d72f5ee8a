package reqtext

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc64"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner reads a JSON body in one validating pass, handing the few fields
// Extract needs to callbacks and skipping (but checking) the rest.
// encoding/json validates the whole body and then decodes it again, which
// made Extract the slowest step of a cache-aware pick.
//
// Semantics follow encoding/json's Unmarshal into the structs Extract used
// to decode (reference_test.go; FuzzExtractMatchesEncodingJSON holds the
// two together: a value of another type is an error, a body that is not
// exactly one JSON value is an error), except where the engines Sluice
// routes to read a body otherwise: vLLM and SGLang (Python's json, then
// pydantic) match a key to a field exactly, not case-insensitively as
// encoding/json does, and of a key given twice take the last value, null
// included (null is "not given"). Sluice must route and weigh a request
// on the prompt the engine will serve: {"prompt": <100k tokens>,
// "PROMPT": "hi"} is the long prompt to vLLM.
type scanner struct {
	b      []byte
	i      int
	err    error
	keyBuf []byte // an escaped key, decoded
}

// maxDepth bounds nesting. The scanner recurses, so a body nested 10,000
// deep (encoding/json's limit) cost megabytes of stack per request; no
// inference request nests past a handful of levels (messages → content →
// parts → image_url), so 128 is generous.
const maxDepth = 128

var errEnd = errors.New("unexpected end of JSON input")

// fail records the first error and stops the scan.
func (s *scanner) fail(err error) {
	if s.err == nil {
		s.err = err
	}
	s.i = len(s.b)
}

func (s *scanner) failf(format string, args ...any) { s.fail(fmt.Errorf(format, args...)) }

// peek skips whitespace and returns the next byte (0 at the end).
func (s *scanner) peek() byte {
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return c
		}
	}
	return 0
}

// end checks that nothing but whitespace follows the top-level value.
func (s *scanner) end() error {
	if s.peek(); s.err == nil && s.i < len(s.b) {
		s.failf("invalid character %q after top-level value", s.b[s.i])
	}
	return s.err
}

// object reads an object, calling field for each key with the scanner at
// the key's value; field must consume the value. The caller has seen '{'.
func (s *scanner) object(depth int, field func(key []byte)) {
	if depth > maxDepth {
		s.failf("exceeded max depth")
		return
	}
	s.i++ // '{'
	if s.peek() == '}' {
		s.i++
		return
	}
	for s.err == nil {
		if c := s.peek(); c != '"' {
			s.unexpected(c, "looking for beginning of object key string")
			return
		}
		key := s.key()
		if c := s.peek(); c != ':' {
			s.unexpected(c, "after object key")
			return
		}
		s.i++
		field(key)
		switch c := s.peek(); c {
		case ',':
			s.i++
		case '}':
			s.i++
			return
		default:
			s.unexpected(c, "after object key:value pair")
			return
		}
	}
}

// array reads an array, calling elem with the scanner at each element;
// elem must consume it. The caller has seen '['.
func (s *scanner) array(depth int, elem func()) {
	if depth > maxDepth {
		s.failf("exceeded max depth")
		return
	}
	s.i++ // '['
	if s.peek() == ']' {
		s.i++
		return
	}
	for s.err == nil {
		elem()
		switch c := s.peek(); c {
		case ',':
			s.i++
		case ']':
			s.i++
			return
		default:
			s.unexpected(c, "after array element")
			return
		}
	}
}

func (s *scanner) unexpected(c byte, where string) {
	if s.i >= len(s.b) {
		s.fail(errEnd)
		return
	}
	s.failf("invalid character %q %s", c, where)
}

// skip validates and skips one value.
func (s *scanner) skip(depth int) {
	switch c := s.peek(); {
	case c == '{':
		s.object(depth+1, func([]byte) { s.skip(depth + 1) })
	case c == '[':
		s.array(depth+1, func() { s.skip(depth + 1) })
	case c == '"':
		s.rawString()
	case c == 't':
		s.literal("true")
	case c == 'f':
		s.literal("false")
	case c == 'n':
		s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		s.number()
	default:
		s.unexpected(c, "looking for beginning of value")
	}
}

// raw validates and skips one value, returning its bytes.
func (s *scanner) raw(depth int) []byte {
	s.peek()
	start := s.i
	s.skip(depth)
	if s.err != nil {
		return nil
	}
	return s.b[start:s.i]
}

func (s *scanner) literal(word string) {
	if !bytes.HasPrefix(s.b[s.i:], []byte(word)) {
		if len(s.b)-s.i < len(word) && bytes.HasPrefix([]byte(word), s.b[s.i:]) {
			s.fail(errEnd)
			return
		}
		s.failf("invalid literal at offset %d", s.i)
		return
	}
	s.i += len(word)
}

// isNull consumes a null if one comes next.
func (s *scanner) isNull() bool {
	if s.peek() == 'n' {
		s.literal("null")
		return true
	}
	return false
}

// number validates and skips a number, returning its text.
func (s *scanner) number() []byte {
	b, start := s.b, s.i
	i := s.i
	digits := func() bool {
		j := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > j
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		s.badNumber(i)
		return nil
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			s.badNumber(i)
			return nil
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			s.badNumber(i)
			return nil
		}
	}
	s.i = i
	return b[start:i]
}

func (s *scanner) badNumber(at int) {
	if at >= len(s.b) {
		s.fail(errEnd)
		return
	}
	s.failf("invalid character %q in numeric literal", s.b[at])
}

// rawString validates and skips a string (the scanner is at its '"'),
// returning it with its quotes and whether it holds an escape.
func (s *scanner) rawString() (raw []byte, escaped bool) {
	b := s.b
	for i := s.i + 1; i < len(b); i++ {
		i = plainRunEnd(b, i) // the common case: plain text
		if i >= len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			raw, s.i = b[s.i:i+1], i+1
			return raw, escaped
		case c == '\\':
			escaped = true
			i++
			if i >= len(b) {
				break
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					s.fail(errEnd)
					return nil, false
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						s.failf("invalid character %q in \\u hexadecimal character escape", h)
						return nil, false
					}
				}
				i += 4
			default:
				s.failf("invalid character %q in string escape code", b[i])
				return nil, false
			}
		case c < 0x20:
			s.failf("invalid character %q in string literal", c)
			return nil, false
		}
	}
	s.fail(errEnd)
	return nil, false
}

// stringSpecial marks the bytes that end a run of plain string content.
var stringSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// unquoter decodes in, the inside of a string rawString validated, as
// encoding/json decodes it (escapes, surrogate pairs, and U+FFFD for a
// lone surrogate or for each byte of invalid UTF-8), one piece at a time
// (next): a run of in that needs no change, or one escape or bad byte's
// decoding (in buf). Callers copy the pieces where they want them, so a
// string costs no allocation of its own.
//
// Each byte is looked at a bounded number of times: a run between
// escapes is found once (run), and its bad bytes split it in place.
// Finding the run again after each bad byte made a string of them cost
// time quadratic in its length: minutes for a 4 MiB prompt of "\xff".
type unquoter struct {
	in  []byte // not yet split into runs and escapes
	run []byte // the rest of the current run (no escape in it)
	buf [utf8.UTFMax]byte
}

// next is the next piece (never empty), nil at the end.
func (u *unquoter) next() []byte {
	if len(u.run) == 0 {
		if len(u.in) == 0 {
			return nil
		}
		if u.in[0] == '\\' {
			var p []byte
			p, u.in = escape(u.in, &u.buf)
			return p
		}
		end := indexByte(u.in, '\\')
		if end < 0 {
			end = len(u.in)
		}
		u.run, u.in = u.in[:end], u.in[end:]
	}
	n := validPrefix(u.run)
	p := u.run[:n]
	if n == 0 {
		p, n = replacement, 1
	}
	u.run = u.run[n:]
	return p
}

// escape decodes the escape in starts with (validated: a whole one
// follows) into buf.
func escape(in []byte, buf *[utf8.UTFMax]byte) (out, rest []byte) {
	n := 2
	switch c := in[1]; c {
	case 'b':
		buf[0] = '\b'
	case 'f':
		buf[0] = '\f'
	case 'n':
		buf[0] = '\n'
	case 'r':
		buf[0] = '\r'
	case 't':
		buf[0] = '\t'
	case 'u':
		r := hex4(in[2:6])
		n = 6
		if utf16.IsSurrogate(r) {
			r2 := rune(-1)
			if len(in) >= 12 && in[6] == '\\' && in[7] == 'u' {
				r2 = hex4(in[8:12])
			}
			if d := utf16.DecodeRune(r, r2); d != unicode.ReplacementChar {
				r, n = d, 12
			} else {
				r = unicode.ReplacementChar
			}
		}
		return utf8.AppendRune(buf[:0], r), in[n:]
	default: // " \\ /
		buf[0] = c
	}
	return buf[:1], in[n:]
}

// validPrefix is the length of run's longest valid UTF-8 prefix, found
// in time linear in it (utf8.Valid stops at the first bad byte).
func validPrefix(run []byte) int {
	if utf8.Valid(run) {
		return len(run)
	}
	for i := 0; i < len(run); {
		if run[i] < utf8.RuneSelf {
			i++
			continue
		}
		if r, size := utf8.DecodeRune(run[i:]); r != utf8.RuneError || size > 1 {
			i += size
			continue
		}
		return i
	}
	return len(run) // not reached: run is not valid
}

var replacement = []byte(string(utf8.RuneError))

// indexByte is bytes.IndexByte, where a string's runs are found (once): a test
// counts the bytes it scans.
var indexByte = bytes.IndexByte

// hex4 reads four hex digits (validated).
func hex4(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// decode turns a validated raw string (with its quotes) into its value.
func decode(raw []byte, escaped bool) string {
	in := raw[1 : len(raw)-1]
	if !escaped && utf8.Valid(in) {
		return string(in)
	}
	var out strings.Builder
	out.Grow(len(in))
	u := unquoter{in: in}
	for p := u.next(); p != nil; p = u.next() {
		out.Write(p)
	}
	return out.String()
}

// equals reports whether the validated raw string decodes to want, with
// no allocation.
func equals(raw []byte, want string) bool {
	u := unquoter{in: raw[1 : len(raw)-1]}
	for p := u.next(); p != nil; p = u.next() {
		if len(p) > len(want) || string(p) != want[:len(p)] {
			return false
		}
		want = want[len(p):]
	}
	return want == ""
}

// maxKeyBytes: a longer raw key names none of the fields Extract reads
// (the longest, max_completion_tokens, is 21 bytes: 126 with every byte
// escaped), so it is not decoded.
const maxKeyBytes = 128

// key reads an object key: valid until the next key is read.
func (s *scanner) key() []byte {
	raw, escaped := s.rawString()
	if s.err != nil {
		return nil
	}
	in := raw[1 : len(raw)-1]
	switch {
	case !escaped:
		return in // invalid UTF-8 matches no field either way
	case len(in) > maxKeyBytes:
		return nil
	}
	s.keyBuf = s.keyBuf[:0]
	u := unquoter{in: in}
	for p := u.next(); p != nil; p = u.next() {
		s.keyBuf = append(s.keyBuf, p...)
	}
	return s.keyBuf
}

// str reads a string field as its raw form (decoded by the caller, once,
// whichever of a repeated key wins); null gives nil: the field is unset,
// as the engines read a null.
func (s *scanner) str(dst *[]byte, field string) {
	switch c := s.peek(); c {
	case '"':
		if raw, _ := s.rawString(); s.err == nil {
			*dst = raw
		}
	case 'n':
		s.literal("null")
		*dst = nil
	default:
		s.typeErr(field, "string")
	}
}

// text decodes a raw string from str ("" for nil).
func text(raw []byte) string {
	if raw == nil {
		return ""
	}
	return decode(raw, bytes.IndexByte(raw, '\\') >= 0)
}

func (s *scanner) boolean(dst *bool, field string) {
	switch c := s.peek(); c {
	case 't':
		s.literal("true")
		*dst = true
	case 'f':
		s.literal("false")
		*dst = false
	case 'n':
		s.literal("null")
		*dst = false
	default:
		s.typeErr(field, "bool")
	}
}

// integer decodes an int field: an integer literal only (1.0 and 1e2 are
// errors, as encoding/json makes them).
func (s *scanner) integer(dst *int, field string) {
	switch c := s.peek(); {
	case c == 'n':
		s.literal("null")
		*dst = 0
	case c == '-' || (c >= '0' && c <= '9'):
		lit := s.number()
		if s.err != nil {
			return
		}
		n, err := strconv.ParseInt(string(lit), 10, strconv.IntSize)
		if err != nil {
			s.failf("json: cannot unmarshal number %s into field %s of type int", lit, field)
			return
		}
		*dst = int(n)
	default:
		s.typeErr(field, "int")
	}
}

// typeErr: a value of another type. Like encoding/json, the body must
// still be valid JSON for the error to be a type error; either way it is
// an error, which is all Extract's callers look at.
func (s *scanner) typeErr(field, want string) {
	s.skip(0)
	if s.err == nil {
		s.failf("json: cannot unmarshal into field %s of type %s", field, want)
	}
}

// top reads the top-level value as an object, into field; a top-level
// null is an empty body (as encoding/json leaves the struct zero).
func (s *scanner) top(what string, field func(key []byte)) error {
	switch c := s.peek(); c {
	case '{':
		s.object(1, field)
	case 'n':
		s.literal("null")
	default:
		s.typeErr(what, "object")
	}
	return s.end()
}

// digester hashes JSON values canonically (CRC-64: the same on every
// Sluice instance, which may share a tree): the value's tokens, each
// string decoded, so spacing and escapes do not change the sum (key
// order does). Each token is tagged: '{' '}' '[' ']' as they are; a
// string as '"', its decoded bytes and their length; a number as '#',
// its literal and '#'; true, false and null as 't', 'f' and 'z'.
type digester struct {
	crc uint64
	n   int
	buf [128]byte // small tokens, hashed together (each Update has a cost)
}

var crcTable = crc64.MakeTable(crc64.ECMA)

func (d *digester) write(b []byte) {
	if d.n+len(b) > len(d.buf) {
		d.flush()
		if len(b) > len(d.buf) {
			d.crc = crc64.Update(d.crc, crcTable, b)
			return
		}
	}
	d.n += copy(d.buf[d.n:], b)
}

func (d *digester) byte(c byte) {
	if d.n == len(d.buf) {
		d.flush()
	}
	d.buf[d.n] = c
	d.n++
}

// length ends a string token.
func (d *digester) length(n int) {
	if d.n+8 > len(d.buf) {
		d.flush()
	}
	binary.LittleEndian.PutUint64(d.buf[d.n:], uint64(n))
	d.n += 8
}

func (d *digester) flush() {
	d.crc = crc64.Update(d.crc, crcTable, d.buf[:d.n])
	d.n = 0
}

func (d *digester) sum() uint64 {
	d.flush()
	return d.crc
}

// str hashes a string token of known value.
func (d *digester) str(s string) {
	d.byte('"')
	d.write([]byte(s))
	d.length(len(s))
}

// value hashes raw, one valid JSON value, in one pass.
func (d *digester) value(raw []byte) {
	for i := 0; i < len(raw); {
		switch c := raw[i]; c {
		case ' ', '\t', '\n', '\r', ',', ':':
			i++
		case '{', '}', '[', ']':
			d.byte(c)
			i++
		case '"':
			s := scanner{b: raw, i: i}
			str, _ := s.rawString()
			if s.err != nil {
				return // not reached: raw is valid
			}
			i = s.i
			d.byte('"')
			n := 0
			u := unquoter{in: str[1 : len(str)-1]}
			for p := u.next(); p != nil; p = u.next() {
				d.write(p)
				n += len(p)
			}
			d.length(n)
		case 't':
			d.byte('t')
			i += len("true")
		case 'f':
			d.byte('f')
			i += len("false")
		case 'n':
			d.byte('z')
			i += len("null")
		default:
			j := i + 1
			for j < len(raw) && (raw[j] >= '0' && raw[j] <= '9' || raw[j] == '.' || raw[j] == 'e' || raw[j] == 'E' || raw[j] == '+' || raw[j] == '-') {
				j++
			}
			d.byte('#')
			d.write(raw[i:j])
			d.byte('#')
			i = j
		}
	}
}
