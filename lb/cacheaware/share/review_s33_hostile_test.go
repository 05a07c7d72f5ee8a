package share

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/redistest"
	"github.com/sluice-router/sluice/lb/tracker"
)

// Records another writer put in the stream (outside input) that name no
// replica of this pool, lack fields or carry a record's worth of address
// never reach the tree nor panic the reader; a record that forges this
// instance's id is skipped as its own. A well-formed
// record written after them is applied, so the reader did read them.
func TestHostilePeerRecordsLeaveTheTreeAlone(t *testing.T) {
	redistest.Each(t, func(t *testing.T, tg redistest.Target) {
		pool := uniquePool(t)
		p := cacheaware.NewPicker(cacheaware.Config{}, tracker.Config{})
		p.SetReplicas(replicas)
		s := New(Config{Conn: tg.Conn, Pool: pool}, p.PeerRouted)
		t.Cleanup(s.Close)
		waitFor(t, "connected", func() bool { return s.Stats().Connected })

		cl := redistest.Client(t, tg.Conn)
		add := func(fv ...string) {
			t.Helper()
			b := cl.B().Xadd().Key(Key("", pool)).Id("*").FieldValue()
			for i := 0; i < len(fv); i += 2 {
				b = b.FieldValue(fv[i], fv[i+1])
			}
			if err := cl.Do(context.Background(), b.Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		add("i", "other", "m", "m", "t", prefix(1), "a", "elsewhere:1") // not a replica here
		add("i", "other", "m", "m", "t", prefix(2))                     // no address
		add("i", "other", "a", "r1:1")                                  // no text
		add("x", "y")                                                   // nothing of ours
		add("i", "other", "m", "m", "t", prefix(3), "a", strings.Repeat("r", 100<<10))
		add("i", s.Instance(), "m", "m", "t", prefix(4), "a", "r2:1") // forged: skipped as own
		add("i", "other", "m", "m", "t", prefix(5), "a", "r3:1")      // the one that counts
		waitFor(t, "the well-formed record applied", func() bool {
			return p.Router().Stats().ReplicaChars["r3:1"] > 0
		})
		st := p.Router().Stats()
		if held := st.Chars - st.ReplicaChars["r3:1"]; held != 0 || len(st.ReplicaChars) > len(replicas) {
			t.Errorf("the tree holds %d characters beside r3:1's: %+v", held, st.ReplicaChars)
		}
		if d := p.Router().Pick("m", prefix(4), func(string) (int, bool) { return 0, true }); d.Reason == cacheaware.CacheHit {
			t.Errorf("a record forging this instance's id was applied: %+v", d)
		}
	})
}
