package modelmetrics

import (
	"bytes"
	"slices"
)

// seriesSet remembers the series of understood metrics a Parse has read,
// so that a series given twice counts once.
//
// Why the first sample, and not an error: one series twice in an
// exposition is malformed (a buggy exporter, or two registries merged),
// and Prometheus itself keeps the first sample and drops the rest; the
// replica's other figures are still good. Summed, as the counts of
// distinct series are (one per engine or model), a duplicate doubled the
// replica's queue; failing the scrape would have thrown its load away.
type seriesSet map[string]struct{}

// again reports whether the series of name with the label set (and value)
// in rest was seen before in this body, and records it.
func (s *seriesSet) again(name, rest []byte) bool {
	if *s == nil {
		*s = seriesSet{}
	}
	k := seriesKey(name, rest)
	if _, ok := (*s)[k]; ok {
		return true
	}
	(*s)[k] = struct{}{}
	return false
}

// seriesKey names a series: its metric name and its labels sorted by name
// (their order and the blanks between them do not make another series).
// A label set it cannot read is keyed by its raw text.
func seriesKey(name, rest []byte) string {
	labels, _, err := splitLabels(rest)
	if err != nil {
		return string(name) + "\x00" + string(rest)
	}
	type pair struct{ k, v []byte }
	var pairs []pair
	for labels = bytes.TrimLeft(labels, " \t,"); len(labels) > 0; labels = bytes.TrimLeft(labels, " \t,") {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 {
			return string(name) + "\x00" + string(rest)
		}
		k := bytes.TrimSpace(labels[:eq])
		v, next, ok := quoted(bytes.TrimLeft(labels[eq+1:], " \t"))
		if !ok {
			return string(name) + "\x00" + string(rest)
		}
		pairs = append(pairs, pair{k, v})
		labels = next
	}
	slices.SortFunc(pairs, func(a, b pair) int { return bytes.Compare(a.k, b.k) })
	key := append([]byte{}, name...)
	for _, p := range pairs {
		key = append(append(append(append(key, 0), p.k...), 0), p.v...)
	}
	return string(key)
}

// quoted splits a quoted label value (still escaped: an escape has one
// spelling, so equal text is an equal value) from what follows it.
func quoted(s []byte) (v, rest []byte, ok bool) {
	if len(s) == 0 || s[0] != '"' {
		return nil, nil, false
	}
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return s[1:i], s[i+1:], true
		}
	}
	return nil, nil, false
}
