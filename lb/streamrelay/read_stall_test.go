package streamrelay

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// A Redis that stops answering (frozen here; a host gone without a word,
// or a proxy whose backend went, alike) ends the reader's blocking read
// within seconds: the read has a deadline, so the reader reports Redis
// away and redials, as the publisher does. Before, the blocking XREAD
// had none (rueidis sends no keep-alive PING on a connection while a
// blocking command is in flight, and the kernel answers TCP keep-alives
// for a frozen process or a proxy): the reader waited on the dead
// connection for good, reporting connected and applying nothing, while
// the stream went on elsewhere.
func TestReaderNoticesRedisStopsAnswering(t *testing.T) {
	srv := redistest.Private(t)
	key := uniqueKey(t)
	var got applied
	r := New(Config{Conn: redisconn.Config{Addrs: []string{srv.Addr}}, Key: key}, got.apply)
	defer r.Close()
	state := func() string { return fmt.Sprintf("reader stats %+v, %v", r.Stats(), &got) }
	waitFor(t, "the relay to connect", func() bool { return r.Stats().Connected }, state)
	time.Sleep(200 * time.Millisecond) // a blocking read in flight
	srv.Signal(syscall.SIGSTOP)
	defer srv.Signal(syscall.SIGCONT)
	deadline := time.Now().Add(15 * time.Second) // the read deadline is ~2 s; without one it waits for good
	for r.Stats().Connected || r.Stats().Errors == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Redis frozen for 15s, the reader still waits on it: %s", state())
		}
		time.Sleep(20 * time.Millisecond)
	}
	srv.Signal(syscall.SIGCONT)
	other := New(Config{Conn: redisconn.Config{Addrs: []string{srv.Addr}}, Key: key}, func(map[string]string, bool) {})
	defer other.Close()
	other.Publish("x", "after the thaw")
	waitFor(t, "the record published after the thaw applied", func() bool { found, _ := got.has("after the thaw"); return found }, state)
}
