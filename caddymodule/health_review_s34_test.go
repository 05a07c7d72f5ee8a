package caddymodule

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
)

// Soundness guard (no bug found): health answers while requests come and
// go on three policies and the set changes; every answer is 200 with
// valid JSON and no negative count, and once every request ended,
// nothing is in flight or draining.
func TestReviewS34HealthStaysValidUnderChurn(t *testing.T) {
	cctx := provisionContext(t)
	name := freshPoolName("health-s34-churn")
	all, err := lb.ParseBackends([]string{"http://127.0.0.1:19501", "http://127.0.0.1:19502", "http://127.0.0.1:19503"})
	if err != nil {
		t.Fatal(err)
	}
	lb.GetPool(name).Set(all)
	var states []*policyState
	for _, m := range []healthPolicy{&LoadAware{Pool: name}, &CacheAware{Pool: name}, &QueuedLeastLatency{Pool: name}} {
		if err := m.Provision(cctx); err != nil {
			t.Fatal(err)
		}
		defer m.Cleanup()
		states = append(states, stateOfAny(m))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(2)
	go func() {
		defer bg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			var set []lb.Backend
			for _, b := range all {
				if rng.IntN(2) == 0 {
					set = append(set, b)
				}
			}
			lb.GetPool(name).Set(set)
		}
	}()
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			rec := httptest.NewRecorder()
			serveHealth(rec, httptest.NewRequest(http.MethodGet, "/_custom_router/health", nil), name)
			var body healthBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusOK {
				t.Errorf("health %d %s (%v)", rec.Code, rec.Body, err)
				return
			}
			for _, b := range body.Backends {
				if b.InFlight < 0 {
					t.Errorf("negative in flight: %s", rec.Body)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			st := states[g%len(states)]
			for range 400 {
				pctx, pcancel := context.WithTimeout(ctx, 5*time.Millisecond)
				l, err := st.picker.Pick(pctx, &lb.Request{Tokens: int64(rng.IntN(100))})
				pcancel()
				if err != nil {
					continue
				}
				kind := []lb.OutcomeKind{lb.Success, lb.Failure, lb.Cancelled}[rng.IntN(3)]
				l.Release(lb.Outcome{Kind: kind, Total: time.Millisecond})
			}
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	lb.GetPool(name).Set(all)
	body, raw := getHealth(t, name)
	for _, b := range body.Backends {
		if b.InFlight != 0 || b.Draining {
			t.Fatalf("after every request ended: %s", raw)
		}
	}
}

// stateOfAny is stateOf, queued_least_latency included.
func stateOfAny(m healthPolicy) *policyState {
	switch p := m.(type) {
	case *QueuedLeastLatency:
		return p.state
	}
	return stateOf(m)
}
