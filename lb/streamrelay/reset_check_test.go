package streamrelay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// connectionsReceived sums INFO's total_connections_received over the
// nodes of cl: every connection any client opened to the deployment.
func connectionsReceived(t *testing.T, cl rueidis.Client) int64 {
	t.Helper()
	var sum int64
	for _, n := range cl.Nodes() {
		info, err := n.Do(context.Background(), n.B().Info().Section("stats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_connections_received:"); ok {
				c, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				sum += c
			}
		}
	}
	return sum
}

// A newest record over ReadBytes is skipped once. The idle reader's reset
// check, once a second, must not read it again: its reply would be cut
// and the connection it shares with the publisher dropped and redialled,
// failing any publish in flight on it, every second for as long as the
// record stays the newest.
func TestIdleReaderKeepsItsConnectionsPastHugeNewest(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		for _, fromNow := range []bool{false, true} {
			t.Run(fmt.Sprintf("fromNow=%v", fromNow), func(t *testing.T) {
				s := newHostileStream(t, tg)
				s.add("x", "old")
				newest := s.add("x", "huge", "v", strings.Repeat("h", 4<<20))
				var got applied
				r := New(Config{Conn: tg.Conn, Key: s.key, FromNow: fromNow, ReadBytes: 256 << 10}, got.apply)
				defer r.Close()
				state := func() string { return fmt.Sprintf("reader stats %+v, %v", r.Stats(), &got) }
				waitFor(t, "the reader to pass the huge record", func() bool { return r.Stats().LastID == newest }, state)
				// One blocking read and its reset check: the reader has
				// redialled what taking the huge record's id cut.
				time.Sleep(time.Duration(blockMillis)*time.Millisecond + 500*time.Millisecond)

				before := connectionsReceived(t, s.cl)
				time.Sleep(3*time.Duration(blockMillis)*time.Millisecond + 500*time.Millisecond)
				if n := connectionsReceived(t, s.cl) - before; n != 0 {
					t.Errorf("idle for three reset checks past a huge newest record, the relay opened %d connections, want 0; %s", n, state())
				}

				// It still notices a reset under it, and reads on.
				if err := s.cl.Do(context.Background(), s.cl.B().Del().Key(s.key).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the reader to notice the stream deleted", func() bool { return r.Stats().Resets == 1 }, state)
				s.add("x", "news")
				waitFor(t, "the reader to apply the news", func() bool { found, _ := got.has("news"); return found }, state)
				if st := r.Stats(); st.Errors != 0 || st.Resets != 1 {
					t.Errorf("reader stats %+v: want no error, 1 reset", st)
				}
			})
		}
	})
}
