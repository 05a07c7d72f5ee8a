package streamrelay

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// ownConnections lists this process's established TCP connections to
// the nodes of cl, by their local port (from /proc: the sockets this
// process holds, matched against the kernel's TCP table). A count kept by
// the Redis server (INFO's total_connections_received) also counted the
// connections other test packages, run in parallel by go test against
// the same servers, opened meanwhile.
func ownConnections(t *testing.T, cl rueidis.Client) map[string]bool {
	t.Helper()
	ports := map[string]bool{}
	for addr := range cl.Nodes() {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			t.Fatal(err)
		}
		ports[fmt.Sprintf("%04X", p)] = true
	}
	inodes := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd to find this process's sockets in: %v", err)
	}
	for _, fd := range fds {
		if link, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil {
			if inode, ok := strings.CutPrefix(link, "socket:["); ok {
				inodes[strings.TrimSuffix(inode, "]")] = true
			}
		}
	}
	own := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			if len(f) < 10 || f[3] != "01" { // 01: established
				continue
			}
			_, remPort, _ := strings.Cut(f[2], ":")
			_, localPort, _ := strings.Cut(f[1], ":")
			if ports[remPort] && inodes[f[9]] {
				own[localPort] = true
			}
		}
	}
	return own
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

				before := ownConnections(t, s.cl)
				if len(before) == 0 {
					t.Fatal("no connection of this process to Redis found in /proc")
				}
				time.Sleep(3*time.Duration(blockMillis)*time.Millisecond + 500*time.Millisecond)
				opened := 0
				for port := range ownConnections(t, s.cl) {
					if !before[port] {
						opened++
					}
				}
				if opened != 0 {
					t.Errorf("idle for three reset checks past a huge newest record, the relay opened %d connections, want 0; %s", opened, state())
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
