package modelmetrics

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// The project's simulator exports vLLM's names; requests held on a
// one-slot replica must show as one running and the rest waiting.
func TestAgainstSimulator(t *testing.T) {
	// The latency outlasts the test: requests end when their client leaves,
	// so nothing depends on timing.
	srv, err := sim.Start(sim.Config{Concurrency: 1, Latency: sim.Latency{Kind: sim.LatencyFixed, Duration: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s := New(Config{Interval: 5 * time.Millisecond})
	s.SetTargets(map[string]string{srv.Addr(): srv.URL()})
	stop := run(t, s)
	defer stop()

	waitFor(t, "an idle replica", func() bool {
		v, fr := s.Get(srv.Addr())
		return fr == Fresh && v.Have == (Have{Waiting: true, Running: true, KVCache: true}) && v.Running == 0 && v.Waiting == 0
	})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/completions",
				strings.NewReader(`{"prompt":"hello","max_tokens":1}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	waitFor(t, "one running, two waiting", func() bool {
		v, fr := s.Get(srv.Addr())
		return fr == Fresh && v.Running == 1 && v.Waiting == 2
	})
	if v, _ := s.Get(srv.Addr()); v.KVCacheUsage != 1 {
		t.Fatalf("a full one-slot replica reports usage 1, got %+v", v)
	}

	cancel()
	wg.Wait()
	waitFor(t, "idle again", func() bool {
		v, fr := s.Get(srv.Addr())
		return fr == Fresh && v.Running == 0 && v.Waiting == 0 && v.KVCacheUsage == 0
	})
	http.DefaultClient.CloseIdleConnections()
}
