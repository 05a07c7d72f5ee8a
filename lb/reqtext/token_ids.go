package reqtext

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// TokenIDsMark starts the Text of a prompt given as token ids. An engine
// reads the text "1 2 3" as other tokens than the ids 1, 2, 3: rendered
// alike, the two shared a prefix in the tree (keyed on model and Text),
// and a replica was picked for a cache it did not hold. No text prompt's
// Text starts with the mark (one that would starts with markEscape), so
// the two never share a prefix. The mark is a Unicode space (U+2029,
// PARAGRAPH SEPARATOR): strings.Fields skips it, so the ids are still the
// fields of Text (lb/kvevents reads them so).
const TokenIDsMark = "\u2029"

// markEscape starts the Text of a text prompt that would start with
// TokenIDsMark or with markEscape itself (U+FFFF, a noncharacter: no
// prompt means it): that keeps a text's Text from starting with the mark,
// and two texts apart. It shares no byte with the mark.
const markEscape = "\uffff"

// startsWithMark: a text starting so gets markEscape in front.
func startsWithMark(b []byte) bool {
	return bytes.HasPrefix(b, []byte(TokenIDsMark)) || bytes.HasPrefix(b, []byte(markEscape))
}

// marked is mark followed by b, within MaxTextBytes (cut on a rune
// boundary, as the writer cuts), and whether it was cut.
func marked(mark string, b []byte, cut bool) (string, bool) {
	if room := MaxTextBytes - len(mark); len(b) > room {
		for room > 0 && !utf8.RuneStart(b[room]) {
			room--
		}
		b, cut = b[:room], true
	}
	var sb strings.Builder
	sb.Grow(len(mark) + len(b))
	sb.WriteString(mark)
	sb.Write(b)
	return sb.String(), cut
}
