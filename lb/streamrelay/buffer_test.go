package streamrelay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// bufferedRecord is one record of bufferedBytes bytes (fields and values).
func bufferedRecord(i int) []string {
	return []string{"x", fmt.Sprintf("%02d", i), "pad", strings.Repeat("p", 1000)}
}

const bufferedBytes = 1 + 2 + 3 + 1000

// Redis away (a private server, killed, then restarted on its address):
// the records wait in the buffer, bounded in bytes as in count. Past
// BufferBytes the oldest go, counted in Dropped, and a record over
// MaxRecordBytes is not kept at all; the newest reach the stream when
// Redis is back.
func TestBufferBytesBoundedThroughOutage(t *testing.T) {
	srv := redistest.Private(t)
	srv.Kill()
	conn := redisconn.Config{Addrs: []string{srv.Addr}}
	key := uniqueKey(t)
	p := New(Config{Conn: conn, Key: key, Buffer: 1000, BufferBytes: 10 << 10, MaxRecordBytes: 2 << 10},
		func(map[string]string, bool) {})
	defer p.Close()
	for i := range 25 {
		p.Publish(bufferedRecord(i)...)
	}
	p.Publish("x", "too large", "pad", strings.Repeat("p", 3<<10))
	// 10 KiB hold the 10 newest records.
	if st := p.Stats(); st.Pending != 10 || st.PendingBytes != 10*bufferedBytes || st.Dropped != 16 || st.Published != 0 {
		t.Fatalf("publisher stats %+v: want 10 pending (%d bytes), 16 dropped", st, 10*bufferedBytes)
	}

	srv2, err := redistest.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv2.Kill)
	var got applied
	r := New(Config{Conn: conn, Key: key}, got.apply)
	defer r.Close()
	state := func() string {
		return fmt.Sprintf("publisher stats %+v; reader stats %+v, %v", p.Stats(), r.Stats(), &got)
	}
	waitFor(t, "the kept records applied", func() bool { found, _ := got.has("24"); return found }, state)
	var want []string
	for i := 15; i < 25; i++ {
		want = append(want, fmt.Sprintf("%02d", i))
	}
	got.mu.Lock()
	xs := slices.Clone(got.xs)
	got.mu.Unlock()
	if !slices.Equal(xs, want) {
		t.Errorf("applied %q, want the 10 newest %q", xs, want)
	}
	if st := p.Stats(); st.Published != 10 || st.Pending != 0 || st.PendingBytes != 0 {
		t.Errorf("publisher stats %+v: want 10 published, nothing pending", st)
	}
}

// Redis up but refusing every XADD (an entry with the largest id there
// is): batches go out, fail and come back. The bytes in flight count
// against BufferBytes with those waiting, so the two together stay under
// it, the rest dropped and counted.
func TestBufferBytesCountInFlight(t *testing.T) {
	tg := redistest.Targets(t)[0]
	ctx := context.Background()
	key := uniqueKey(t)
	cl := redistest.Client(t, tg.Conn)
	t.Cleanup(func() { cl.Do(context.Background(), cl.B().Del().Key(key).Build()) })
	const maxID = "18446744073709551615-18446744073709551615"
	if err := cl.Do(ctx, cl.B().Xadd().Key(key).Id(maxID).FieldValue().
		FieldValue(InstanceField, "hostile").FieldValue("x", "max").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	p := New(Config{Conn: tg.Conn, Key: key, Buffer: 1000, BufferBytes: 10 << 10, MaxRecordBytes: 2 << 10},
		func(map[string]string, bool) {})
	defer p.Close()
	for i := range 25 {
		p.Publish(bufferedRecord(i)...)
		if st := p.Stats(); st.PendingBytes > 10<<10 {
			t.Fatalf("publisher stats %+v: over the 10 KiB budget", st)
		}
	}
	waitFor(t, "the publisher to fail twice and hold the records", func() bool {
		st := p.Stats()
		return st.Errors >= 2 && strings.Contains(st.LastError, "exhausted") && st.Pending == 10
	}, func() string { return fmt.Sprintf("publisher stats %+v", p.Stats()) })
	if st := p.Stats(); st.PendingBytes != 10*bufferedBytes || st.Dropped != 15 || st.Published != 0 {
		t.Errorf("publisher stats %+v: want %d bytes pending, 15 dropped", st, 10*bufferedBytes)
	}
}
