package loadaware

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// Picks, retries and releases (some twice) racing set changes and
// reloads (adaptive mode on and off, scorers and sessions changing):
// every lease counts once and leaves once, a second Release reports
// false, and when all are released no replica has a request or a token
// in flight. Run with -race.
func TestConcurrentPicksReleasesSetChangesAndReloadsBalanceTheCounts(t *testing.T) {
	p := NewPicker(PickerConfig{Tracker: tracker.Config{MaxFails: 1000}})
	all := []string{"a:1", "b:1", "c:1", "d:1", "e:1"}
	p.SetReplicas(all)
	cfgs := []PickerConfig{
		{Tracker: tracker.Config{MaxFails: 1000}},
		{Policy: Config{Preset: PresetHeimdall, SLO: time.Millisecond, MaxNumEndpoints: 3}, Tracker: tracker.Config{MaxFails: 1000}},
		{Policy: Config{Weights: map[string]float64{ActiveTokens: 1, SessionAffinity: 2, NoHitLRU: 1}, MaxNumEndpoints: 5, LRUSize: 2}, SessionKey: "k", Tracker: tracker.Config{MaxFails: 1000}},
	}
	ctx := context.Background()
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { // set changes and reloads
		defer bg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p.SetReplicas(all[i%3 : 3+i%3])
			if err := p.Configure(cfgs[i%len(cfgs)]); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				req := &lb.Request{Tokens: int64(1 + i%700), Parsed: true, Text: fmt.Sprintf("prompt %d %d", g, i%5),
					Session: p.SessionToken(all[i%len(all)])}
				l, err := p.Pick(ctx, req)
				if err != nil {
					continue // every replica of a set briefly down: allowed
				}
				if i%3 == 0 { // a retry on the fallback order
					req.Avoid = append(req.Avoid, l.Replica())
					if !l.Release(lb.Outcome{Kind: lb.Failure}) {
						t.Error("first Release reported false")
					}
					req.Attempt = 1
					if l, err = p.Pick(ctx, req); err != nil {
						continue
					}
				}
				out := lb.Outcome{Kind: lb.Success, Latency: time.Duration(rand.IntN(5)) * time.Millisecond}
				if !l.Release(out) {
					t.Error("first Release reported false")
				}
				if l.Release(out) {
					t.Error("second Release of one lease reported true")
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	for _, addr := range all {
		p.SetReplicas(all) // every replica present again, so the view reads all
		v, ok := p.Tracker().View(addr, time.Time{})
		if !ok || v.InFlight != 0 || v.ActiveCost != 0 {
			t.Errorf("%s after every lease was released: present %v, in flight %d, tokens %d; want 0 and 0", addr, ok, v.InFlight, v.ActiveCost)
		}
	}
	if n := p.InFlight(); len(n) > 0 {
		for a, c := range n {
			if c != 0 {
				t.Errorf("InFlight[%s] = %d after every release", a, c)
			}
		}
	}
}
