package streamrelay

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb/redistest"
)

// A record over ReadBytes amid records within bounds, all read in one
// batch: the reply is cut, the reader goes record by record, skips the
// huge one and applies each other record once, in order, as history (the
// stream's end not yet reached); a record published later is news.
func TestReaderSlowPathAppliesOnceAsHistory(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		s := newHostileStream(t, tg)
		var want []string
		for i := range 5 {
			want = append(want, fmt.Sprint("b", i))
			s.add("x", want[len(want)-1])
		}
		s.add("x", "huge", "v", strings.Repeat("h", 1<<20))
		for i := range 5 {
			want = append(want, fmt.Sprint("a", i))
			s.add("x", want[len(want)-1])
		}
		var got applied
		r := New(Config{Conn: tg.Conn, Key: s.key, MaxRecordBytes: 1024, ReadBytes: 256 << 10}, got.apply)
		defer r.Close()
		if c := r.cfg.readCount(); c <= 11 {
			t.Fatalf("a read asks for %d records: want more than the stream holds", c)
		}
		state := func() string { return fmt.Sprintf("reader stats %+v, %v", r.Stats(), &got) }
		waitFor(t, "the history applied", func() bool { found, _ := got.has("a4"); return found }, state)
		s.add("x", "news")
		waitFor(t, "the news applied", func() bool { found, _ := got.has("news"); return found }, state)
		got.mu.Lock()
		xs, hist := slices.Clone(got.xs), slices.Clone(got.history)
		got.mu.Unlock()
		if !slices.Equal(xs, append(want, "news")) {
			t.Errorf("applied %q, want %q", xs, append(want, "news"))
		}
		for i, h := range hist {
			if h != (i < len(want)) {
				t.Errorf("record %q applied with history %v", xs[i], h)
			}
		}
		if st := r.Stats(); st.Oversize != 1 || st.Errors != 0 || st.Resets != 0 {
			t.Errorf("reader stats %+v: want 1 oversize, no error, no reset", st)
		}
	})
}
