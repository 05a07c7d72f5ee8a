package flow

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// Fairness ids and model names come from clients. Before they become
// metric label values they are made valid UTF-8 and short, and their
// number is bounded: past MaxLabelValues distinct values per label, new
// ones are reported as OverflowLabel (Prometheus keeps every series it
// ever saw; an unbounded label is a memory leak a client controls).
const (
	// MaxLabelValues bounds the distinct values of one client-chosen label.
	MaxLabelValues = 1000
	// MaxLabelBytes bounds one label value.
	MaxLabelBytes = 128
	// OverflowLabel stands for every value past MaxLabelValues.
	OverflowLabel = "__other__"
	// MaxLabelSeries bounds the distinct (fairness id, model, target
	// model) combinations of one metric: each label alone is bounded, but
	// their product was not.
	MaxLabelSeries = 10 * MaxLabelValues
)

// labelSet admits up to MaxLabelValues distinct values.
type labelSet struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// value returns s as a label value: sanitized, and OverflowLabel once the
// set is full and s is new.
func (l *labelSet) value(s string) string {
	s = SanitizeLabel(s)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[s]; ok {
		return s
	}
	if l.seen == nil {
		l.seen = map[string]struct{}{}
	}
	if len(l.seen) >= MaxLabelValues {
		return OverflowLabel
	}
	l.seen[s] = struct{}{}
	return s
}

// seriesSet admits up to MaxLabelSeries distinct label combinations.
type seriesSet struct {
	mu   sync.Mutex
	seen map[[3]string]struct{}
}

// admit reports whether k is one of the first MaxLabelSeries distinct
// combinations (past the bound, only those already admitted).
func (l *seriesSet) admit(k [3]string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[k]; ok {
		return true
	}
	if l.seen == nil {
		l.seen = map[[3]string]struct{}{}
	}
	if len(l.seen) >= MaxLabelSeries {
		return false
	}
	l.seen[k] = struct{}{}
	return true
}

// SanitizeLabel makes s valid UTF-8 (invalid bytes become U+FFFD) and at
// most MaxLabelBytes long (cut on a rune boundary).
func SanitizeLabel(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) > MaxLabelBytes {
		cut := MaxLabelBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// ValidFlowID reports whether a client-given fairness id can be used as
// is: valid UTF-8, at most MaxLabelBytes.
func ValidFlowID(s string) bool {
	return len(s) <= MaxLabelBytes && utf8.ValidString(s)
}
