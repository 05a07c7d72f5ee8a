package streamrelay

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// hostileStream is a stream key written to as anyone with write access to
// it could: entries of any size, any number of fields.
type hostileStream struct {
	t   *testing.T
	cl  rueidis.Client
	key string
}

func newHostileStream(t *testing.T, tg redistest.Target) hostileStream {
	key := uniqueKey(t)
	cl := redistest.Client(t, tg.Conn)
	t.Cleanup(func() { cl.Do(context.Background(), cl.B().Del().Key(key).Build()) })
	return hostileStream{t, cl, key}
}

// add appends one entry of field, value pairs and returns its id.
func (s hostileStream) add(fieldValues ...string) string {
	s.t.Helper()
	cmd := s.cl.B().Xadd().Key(s.key).Id("*").FieldValue().FieldValue(InstanceField, "hostile")
	for i := 0; i < len(fieldValues); i += 2 {
		cmd = cmd.FieldValue(fieldValues[i], fieldValues[i+1])
	}
	id, err := s.cl.Do(context.Background(), cmd.Build()).ToString()
	if err != nil {
		s.t.Fatal(err)
	}
	return id
}

// allocated is how many bytes the process allocated while fn ran.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

const hugeRecord = 64 << 20

// Entries over the relay's bounds: one over MaxRecordBytes, one with more
// fields than a record may have, and two over ReadBytes, the stream's
// first among them. The reader applies none of them, counts each in
// Oversize, and goes on past them to the records that follow.
func TestReaderSkipsOversizeRecords(t *testing.T) { redistest.Each(t, testReaderSkipsOversizeRecords) }

func testReaderSkipsOversizeRecords(t *testing.T, tg redistest.Target) {
	s := newHostileStream(t, tg)
	huge := strings.Repeat("h", 4<<20)
	s.add("x", "huge first", "v", huge)
	s.add("x", "before")
	s.add("x", "over", "v", strings.Repeat("o", 2048))
	many := []string{"x", "many fields"}
	for i := range 100 {
		many = append(many, fmt.Sprint("f", i), "")
	}
	s.add(many...)
	s.add("x", "huge", "v", huge)
	last := s.add("x", "after")

	var got applied
	r := New(Config{Conn: tg.Conn, Key: s.key, MaxRecordBytes: 1024, ReadBytes: 256 << 10}, got.apply)
	defer r.Close()
	state := func() string { return fmt.Sprintf("reader stats %+v, %v", r.Stats(), &got) }
	waitFor(t, "the reader to read the whole stream", func() bool { return r.Stats().LastID == last }, state)
	got.mu.Lock()
	xs := slices.Clone(got.xs)
	got.mu.Unlock()
	if !slices.Equal(xs, []string{"before", "after"}) {
		t.Errorf("applied %q, want only the records within bounds", xs)
	}
	if st := r.Stats(); st.Oversize != 4 || st.Applied != 2 || st.Errors != 0 || st.Resets != 0 {
		t.Errorf("reader stats %+v: want 4 oversize, 2 applied, no error, no reset", st)
	}
}

// A record far over ReadBytes is cut from the reply before the client
// allocates it: reading past it costs a small part of its size.
func TestReaderDoesNotHoldHugeRecord(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		s := newHostileStream(t, tg)
		s.add("x", "huge", "v", strings.Repeat("h", hugeRecord))
		last := s.add("x", "after")
		var got applied
		var r *Relay
		grew := allocated(func() {
			r = New(Config{Conn: tg.Conn, Key: s.key, MaxRecordBytes: 1024, ReadBytes: 1 << 20}, got.apply)
			waitFor(t, "the reader to read past the huge record", func() bool { return r.Stats().LastID == last },
				func() string { return fmt.Sprintf("reader stats %+v, %v", r.Stats(), &got) })
		})
		defer r.Close()
		t.Logf("reading past the huge record allocated %d KiB", grew>>10)
		if grew >= hugeRecord {
			t.Errorf("reading the stream allocated %d MiB: the %d MiB record was held", grew>>20, hugeRecord>>20)
		}
		if found, _ := got.has("after"); !found {
			t.Errorf("the record after the huge one not applied: %v", &got)
		}
		if st := r.Stats(); st.Oversize != 1 || st.Errors != 0 {
			t.Errorf("reader stats %+v: want 1 oversize, no error", st)
		}
	})
}

// A reader started from now positions itself at the newest record, and
// when idle checks the newest record for a reset: positioning reads it, a
// huge one cut there, its id still taken; the check then asks for the id
// alone (no reset, no error).
func TestReaderFromNowPastHugeNewest(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		s := newHostileStream(t, tg)
		s.add("x", "old")
		newest := s.add("x", "huge", "v", strings.Repeat("h", hugeRecord))
		var got applied
		var r *Relay
		grew := allocated(func() {
			r = New(Config{Conn: tg.Conn, Key: s.key, FromNow: true, ReadBytes: 1 << 20}, got.apply)
			waitFor(t, "the reader to position itself", func() bool { return r.Stats().LastID == newest },
				func() string { return fmt.Sprintf("reader stats %+v", r.Stats()) })
			// Idle past a blocking read: the reset check runs.
			time.Sleep(time.Duration(blockMillis)*time.Millisecond + 500*time.Millisecond)
		})
		defer r.Close()
		t.Logf("positioning and idling allocated %d KiB", grew>>10)
		if grew >= hugeRecord {
			t.Errorf("positioning and idling allocated %d MiB: the %d MiB record was held", grew>>20, hugeRecord>>20)
		}
		s.add("x", "news")
		waitFor(t, "the reader to apply the news", func() bool { found, _ := got.has("news"); return found },
			func() string { return fmt.Sprintf("reader stats %+v, %v", r.Stats(), &got) })
		if _, history := got.has("news"); history {
			t.Errorf("the news applied as history: %v", &got)
		}
		if st := r.Stats(); st.Applied != 1 || st.Resets != 0 || st.Errors != 0 {
			t.Errorf("reader stats %+v: want 1 applied, no reset, no error", st)
		}
	})
}
