package streamrelay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func uniqueKey(t *testing.T) string {
	return "{" + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + fmt.Sprint(time.Now().UnixNano()) + "}:relay"
}

func waitFor(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; %s", what, state())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// applied collects what a relay applies.
type applied struct {
	mu      sync.Mutex
	xs      []string // field "x" of each record
	history []bool
}

func (a *applied) apply(f map[string]string, history bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.xs = append(a.xs, f["x"])
	a.history = append(a.history, history)
}

func (a *applied) has(x string) (found, history bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, v := range a.xs {
		if v == x {
			return true, a.history[i]
		}
	}
	return false, false
}

func (a *applied) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprintf("applied %q (history %v)", a.xs, a.history)
}

// A reader that has read a record with an id beyond any the stream will
// produce again (written with an explicit far-future id, here or as the
// largest id there is) must not stay behind it forever once the key is
// deleted (or Redis restarts empty, or fails over to a server whose clock
// is behind): new records get ids below its last id. It notices the reset
// when a read comes back empty, re-reads the new stream from its start,
// and counts the reset.
func TestReaderRecoversFromStreamReset(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		for _, fromNow := range []bool{false, true} {
			t.Run(fmt.Sprintf("fromNow=%v", fromNow), func(t *testing.T) {
				testReaderRecoversFromStreamReset(t, tg, fromNow)
			})
		}
	})
}

func testReaderRecoversFromStreamReset(t *testing.T, tg redistest.Target, fromNow bool) {
	ctx := context.Background()
	key := uniqueKey(t)
	cl := redistest.Client(t, tg.Conn)
	t.Cleanup(func() { cl.Do(context.Background(), cl.B().Del().Key(key).Build()) })
	var got applied
	r := New(Config{Conn: tg.Conn, Key: key, FromNow: fromNow}, got.apply)
	defer r.Close()
	state := func() string { return fmt.Sprintf("reader stats %+v, %v", r.Stats(), &got) }
	// The reader reads the stream (a FromNow one is positioned): it
	// applies a record added now.
	var warmID string
	for found := false; !found; found, _ = got.has("warm") {
		id, err := cl.Do(ctx, cl.B().Xadd().Key(key).Id("*").FieldValue().
			FieldValue(InstanceField, "other").FieldValue("x", "warm").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		warmID = id
		waitFor(t, "the reader to reach the record", func() bool { return r.Stats().LastID == warmID }, state)
	}
	base := r.Stats().Applied

	const future = "99999999999999-0"
	if err := cl.Do(ctx, cl.B().Xadd().Key(key).Id(future).FieldValue().
		FieldValue(InstanceField, "hostile").FieldValue("x", "future").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reader to read the future record", func() bool { return r.Stats().LastID == future }, state)
	if err := cl.Do(ctx, cl.B().Del().Key(key).Build()).Error(); err != nil {
		t.Fatal(err)
	}

	p := New(Config{Conn: tg.Conn, Key: key}, func(map[string]string, bool) {})
	defer p.Close()
	p.Publish("x", "after-reset")
	waitFor(t, "the record published", func() bool { return p.Stats().Published == 1 }, state)
	waitFor(t, "the reader to apply the record published after the reset",
		func() bool { found, _ := got.has("after-reset"); return found }, state)

	st := r.Stats()
	if st.Resets != 1 || st.Errors != 0 || !st.Connected || st.LastID == future {
		t.Errorf("reader stats %+v: want 1 reset, no error, connected, past the future id", st)
	}
	// Replayed from the new stream's start, like a replay on start.
	if _, history := got.has("after-reset"); !history {
		t.Errorf("the record read after the reset is news, want history: %v", &got)
	}

	// And the relay goes on: news after the replay.
	p.Publish("x", "later")
	waitFor(t, "the next record", func() bool { found, _ := got.has("later"); return found }, state)
	if _, history := got.has("later"); history {
		t.Errorf("a record published after the replay is history: %v", &got)
	}
	if st := r.Stats(); st.Resets != 1 || st.Applied != base+3 {
		t.Errorf("reader stats %+v: want 1 reset, %d applied", st, base+3)
	}
}

// An entry with the largest id there is makes every XADD * fail ("the
// stream has exhausted the last possible ID") until the key is deleted:
// the publisher counts the errors, backs off, holds its records in its
// bounded buffer, and publishes them once the key is gone; the reader
// that read the entry then applies them.
func TestMaxIDEntry(t *testing.T) { redistest.Each(t, testMaxIDEntry) }

func testMaxIDEntry(t *testing.T, tg redistest.Target) {
	ctx := context.Background()
	key := uniqueKey(t)
	cl := redistest.Client(t, tg.Conn)
	t.Cleanup(func() { cl.Do(context.Background(), cl.B().Del().Key(key).Build()) })
	var got applied
	r := New(Config{Conn: tg.Conn, Key: key}, got.apply)
	defer r.Close()
	const maxID = "18446744073709551615-18446744073709551615"
	if err := cl.Do(ctx, cl.B().Xadd().Key(key).Id(maxID).FieldValue().
		FieldValue(InstanceField, "hostile").FieldValue("x", "max").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reader to read the max-id record", func() bool { return r.Stats().LastID == maxID },
		func() string { return fmt.Sprintf("reader stats %+v", r.Stats()) })

	p := New(Config{Conn: tg.Conn, Key: key, Buffer: 4}, func(map[string]string, bool) {})
	defer p.Close()
	pstate := func() string {
		return fmt.Sprintf("publisher stats %+v; reader stats %+v, %v", p.Stats(), r.Stats(), &got)
	}
	for i := range 6 {
		p.Publish("x", fmt.Sprint("held ", i))
	}
	// Retried (the second error), and held between tries (not in flight).
	waitFor(t, "the publisher to count the failure and hold the records", func() bool {
		st := p.Stats()
		return st.Errors >= 2 && strings.Contains(st.LastError, "exhausted") && st.Pending == 4
	}, pstate)
	// The buffer's bound: the 2 oldest dropped. (Connected is not checked:
	// the publisher's own reader reads the stream fine.)
	if st := p.Stats(); st.Published != 0 || st.Dropped != 2 {
		t.Errorf("publisher stats %+v: want nothing published, 2 dropped", st)
	}

	if err := cl.Do(ctx, cl.B().Del().Key(key).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held records published", func() bool { return p.Stats().Published == 4 }, pstate)
	waitFor(t, "the reader to apply them", func() bool { found, _ := got.has("held 5"); return found }, pstate)
	for i := 2; i < 6; i++ {
		if found, _ := got.has(fmt.Sprint("held ", i)); !found {
			t.Errorf("held %d not applied: %v", i, &got)
		}
	}
	if st := r.Stats(); st.Resets != 1 || st.Errors != 0 || st.Applied != 5 {
		t.Errorf("reader stats %+v: want 1 reset, no error, 5 applied", st)
	}
}
