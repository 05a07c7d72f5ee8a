package streamrelay

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redisconn"
	"github.com/sluice-router/sluice/lb/redistest"
)

// The reader checks the newest record for a reset each idle second, and
// a newest record over ReadBytes cuts that reply and drops its
// connection. It must not be the connection the publisher pipelines its
// XADDs on: one sent behind the check would be run by Redis, fail here
// with the cut, and be requeued and published twice.
func TestNewestIDCutKeepsPublishConnection(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		s := newHostileStream(t, tg)
		newest := s.add("x", "huge", "v", strings.Repeat("h", 4<<20))
		r := &Relay{cfg: Config{Conn: tg.Conn, Key: s.key, ReadBytes: 1 << 20}.withDefaults()}
		opt, err := r.cfg.Conn.ClientOption(redisconn.ConnTimeout(r.cfg.Conn.ReadTimeout))
		if err != nil {
			t.Fatal(err)
		}
		opt.DialCtxFn = dialBounded(r.cfg.ReadBytes)
		cl, err := rueidis.NewClient(opt)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ctx := context.Background()
		clientID := func() int64 {
			t.Helper()
			id, err := cl.Do(ctx, cl.B().ClientId().Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		before := clientID()
		id, found, err := r.newestID(ctx, cl)
		if err != nil || !found || id != newest {
			t.Fatalf("newestID = %q, %v, %v: want %q", id, found, err, newest)
		}
		if after := clientID(); after != before {
			t.Errorf("the pipelined connection was redialled (client id %d, then %d): the newest record's cut dropped it", before, after)
		}
	})
}
