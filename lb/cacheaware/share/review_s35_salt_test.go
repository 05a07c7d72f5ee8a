package share

import (
	"context"
	"sync"
	"testing"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/cacheaware"
	"github.com/sluice-router/sluice/lb/kvevents"
	"github.com/sluice-router/sluice/lb/redistest"
	"github.com/sluice-router/sluice/lb/streamrelay"
	"github.com/sluice-router/sluice/lb/tracker"
)

// peerSpec is the exact view of an instance that takes its peers'
// decisions as speculation: what it was told, with the salt tag.
type peerSpec struct {
	mu   sync.Mutex
	tags map[string]string // text -> salt tag
}

func (s *peerSpec) Lookup(*lb.Request, []string) ([]float64, []bool, func(string)) {
	return nil, nil, nil
}

func (s *peerSpec) SpeculatePeer(_, text, _, tag string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tags[text] = tag
}

func (s *peerSpec) tag(text string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tag, ok := s.tags[text]
	return tag, ok
}

// A salted request's placement reaches the other instances with its salt's
// tag, so their exact view speculates it where that salt's requests would
// look, not as a hit for every unsalted request of the prompt (the engine
// isolates salted blocks); an unsalted one, and one published by an
// instance of the previous version (no tag field), arrive unsalted. The
// salt itself never goes to Redis.
func TestReviewS35APeersDecisionCarriesItsSaltTag(t *testing.T) {
	for _, tg := range redistest.Targets(t) {
		t.Run(tg.Name, func(t *testing.T) {
			pool := uniquePool(t)
			a := newInstance(t, tg.Conn, pool)
			b := cacheaware.NewPicker(cacheaware.Config{}, tracker.Config{})
			b.SetReplicas(replicas)
			spec := &peerSpec{tags: map[string]string{}}
			b.SetExact(spec)
			sb := New(Config{Conn: tg.Conn, Pool: pool}, b.PeerRouted)
			t.Cleanup(sb.Close)

			salted, plain := prefix(1)+" salted", prefix(2)+" plain"
			for i, req := range []*lb.Request{
				// News, not history: the entries after b has read one.
				{Model: "m", Text: prefix(0) + " first", Parsed: true},
				{Model: "m", Text: salted, Parsed: true, CacheSalt: "tenant-secret"},
				{Model: "m", Text: plain, Parsed: true},
			} {
				l, err := a.p.Pick(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				l.Release(lb.Outcome{})
				if i == 0 {
					waitFor(t, "b applies the first entry", func() bool { return sb.Stats().Applied == 1 })
				}
			}
			// An entry as the previous version published it: no tag.
			old := streamrelay.New(streamrelay.Config{Conn: tg.Conn.WithDefaults(), Key: Key(tg.Conn.WithDefaults().KeyPrefix, pool)}, func(map[string]string, bool) {})
			old.Publish("m", "m", "t", prefix(3)+" old", "a", replicas[0])
			t.Cleanup(old.Close)
			waitFor(t, "b applies the four entries", func() bool { return sb.Stats().Applied == 4 })

			want := map[string]string{salted: kvevents.SaltTag("tenant-secret"), plain: "", prefix(3) + " old": ""}
			for text, wantTag := range want {
				if got, ok := spec.tag(text); !ok || got != wantTag {
					t.Errorf("%.30q...: speculated with tag %q (told %v), want %q", text, got, ok, wantTag)
				}
			}
		})
	}
}
