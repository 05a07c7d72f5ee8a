package streamrelay

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// oneByteConn hands its reads over a byte at a time: every header and
// line end arrives split.
type oneByteConn struct{ net.Conn }

func (c oneByteConn) Read(p []byte) (int, error) { return c.Conn.Read(p[:min(len(p), 1)]) }

// boundedClient is a client of the shared Redis whose connections are
// bounded to limit bytes a reply and read a byte at a time.
func boundedClient(t *testing.T, limit int64) rueidis.Client {
	return dialledClient(t, redistest.Targets(t)[0], limit, true)
}

// Replies of every kind the relay's connections carry (and more) pass
// through unchanged, read a byte at a time; each counts on its own, so
// many under the limit pass though together they are far over it.
func TestBoundedConnPassesRepliesThrough(t *testing.T) {
	const limit = 16 << 10
	cl := boundedClient(t, limit)
	ctx := context.Background()
	key := uniqueKey(t)
	t.Cleanup(func() {
		for _, suffix := range []string{"", ":s", ":h", ":set", ":z"} {
			cl.Do(context.Background(), cl.B().Del().Key(key+suffix).Build())
		}
	})
	do := func(cmd rueidis.Completed) rueidis.RedisResult { return cl.Do(ctx, cmd) }
	if s, err := do(cl.B().Ping().Build()).ToString(); err != nil || s != "PONG" {
		t.Errorf("PING: %q %v", s, err)
	}
	for _, x := range []string{"a", "", strings.Repeat("b", 70)} {
		if err := do(cl.B().Xadd().Key(key).Id("*").FieldValue().FieldValue("x", x).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 * limit / 1024 { // a reply of some 1 KiB each
		es, err := do(cl.B().Xrange().Key(key).Start("-").End("+").Build()).AsXRange()
		if err != nil || len(es) != 3 || es[2].FieldValues["x"] != strings.Repeat("b", 70) {
			t.Fatalf("XRANGE: %v %v", es, err)
		}
	}
	xs, err := do(cl.B().Xread().Count(2).Streams().Key(key).Id("0-0").Build()).AsXRead()
	if err != nil || len(xs[key]) != 2 {
		t.Errorf("XREAD: %v %v", xs, err)
	}
	if _, err := do(cl.B().Xread().Streams().Key(key + ":none").Id("0-0").Build()).AsXRead(); !rueidis.IsRedisNil(err) {
		t.Errorf("XREAD of no stream: %v, want nil", err)
	}
	if _, err := do(cl.B().Get().Key(key + ":none").Build()).ToString(); !rueidis.IsRedisNil(err) {
		t.Errorf("GET of no key: %v, want nil", err)
	}
	if err := do(cl.B().Hset().Key(key+":h").FieldValue().FieldValue("f", "v").FieldValue("g", "w").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if m, err := do(cl.B().Hgetall().Key(key + ":h").Build()).AsStrMap(); err != nil || m["g"] != "w" || len(m) != 2 {
		t.Errorf("HGETALL: %v %v", m, err)
	}
	if err := do(cl.B().Sadd().Key(key + ":set").Member("m").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if ms, err := do(cl.B().Smembers().Key(key + ":set").Build()).AsStrSlice(); err != nil || len(ms) != 1 {
		t.Errorf("SMEMBERS: %v %v", ms, err)
	}
	if err := do(cl.B().Zadd().Key(key+":z").ScoreMember().ScoreMember(1.5, "m").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if f, err := do(cl.B().Zscore().Key(key + ":z").Member("m").Build()).AsFloat64(); err != nil || f != 1.5 {
		t.Errorf("ZSCORE: %v %v", f, err)
	}
	if n, err := do(cl.B().Exists().Key(key).Build()).AsInt64(); err != nil || n != 1 {
		t.Errorf("EXISTS: %v %v", n, err)
	}
	if err := do(cl.B().Incr().Key(key).Build()).Error(); err == nil || asCut(err) != nil {
		t.Errorf("INCR of a stream: %v, want Redis's error", err)
	}
}

// A reply over the limit is cut before its string is allocated, keeping
// its first strings (here the id of the entry); the client redials and
// goes on.
func TestBoundedConnCutsAReplyOverTheLimit(t *testing.T) {
	cl := boundedClient(t, 16<<10)
	ctx := context.Background()
	key := uniqueKey(t)
	t.Cleanup(func() { cl.Do(context.Background(), cl.B().Del().Key(key).Build()) })
	id, err := cl.Do(ctx, cl.B().Xadd().Key(key).Id("*").FieldValue().FieldValue("x", strings.Repeat("x", 64<<10)).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.Do(ctx, cl.B().Xrevrange().Key(key).End("+").Start("-").Count(1).Build()).AsXRange()
	cut := asCut(err)
	if cut == nil {
		t.Fatalf("XREVRANGE of a 64 KiB entry through a 16 KiB bound: %v, want a cut", err)
	}
	if got, ok := cut.string(0); !ok || got != id {
		t.Errorf("the cut kept %q, want the entry's id %s first", cut.first, id)
	}
	if s, err := cl.Do(ctx, cl.B().Ping().Build()).ToString(); err != nil || s != "PONG" {
		t.Errorf("PING after the cut: %q %v", s, err)
	}
}
