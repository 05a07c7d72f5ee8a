package redisleast

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/lb/redistest"
)

// Selects that Redis never answered (it was killed mid-call) are released
// as lost selects when it is back, and each leaves a tombstone in the
// instance's hash that bars the select if it still arrives. Nothing else
// removed them while the instance lived: every Redis fault added some, for
// good. They are swept once no late select can arrive (tombAge), so the
// hash holds only the requests in flight again. (The batched least-request
// mode has no lost selects: a batch is sent again as it was, see batch_test.go.)
func TestTombstonesOfLostSelectsAreSwept(t *testing.T) {
	oneCallModes(t, testTombstonesOfLostSelectsAreSwept)
}

func testTombstonesOfLostSelectsAreSwept(t *testing.T, mode func(string) Config) {
	srv := privateRedis(t)
	cfg := mode(srv.Addr)
	cfg.LeaseTTL = 150 * time.Millisecond // the maintenance loop runs every 50 ms
	cfg.ReadTimeout = 100 * time.Millisecond
	cfg.BreakerBackoff = 50 * time.Millisecond
	s := newStore(t, cfg, "tombs")
	reps := []string{"10.0.0.1:1", "10.0.0.2:1"}
	s.SetReplicas(reps)
	ctx := context.Background()

	srv.Kill()
	for i := 0; i < 10; i++ { // until the breaker opens, each one's outcome is unknown
		l, err := s.Select(ctx, reps)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(ok)
	}
	if s.pend.len() == 0 {
		t.Fatal("no lost select pending: the fault did not happen as planned")
	}
	restarted, err := redistest.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Kill)
	c := raw(t, srv.Addr)
	inst := s.ident.Load().inst
	var n int64
	waitFor(t, "the lost selects' releases to leave tombstones", func() bool {
		n = fieldsOf(t, c, inst)
		return s.Stats().Breaker == Closed && s.pend.len() == 0 && n > 0
	})
	t.Logf("%d tombstones", n)
	// A request in flight keeps its record throughout.
	held := sel(t, s, reps...)
	waitFor(t, "the tombstones to be swept", func() bool { return fieldsOf(t, c, inst) == 1 })
	held.Release(ok)
	waitFor(t, "the instance hash to empty", func() bool { return fieldsOf(t, c, inst) == 0 })
	if n := mustCounts(t, s); n[reps[0]]+n[reps[1]] != 0 {
		t.Fatalf("counts %v", n)
	}
}

// fieldsOf is how many records and tombstones an instance hash holds
// (not its bookkeeping: "#", "!").
func fieldsOf(t *testing.T, c rueidis.Client, inst string) int64 {
	t.Helper()
	kv, err := c.Do(context.Background(), c.B().Hgetall().Key(inst).Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	delete(kv, "#")
	delete(kv, "!")
	return int64(len(kv))
}
