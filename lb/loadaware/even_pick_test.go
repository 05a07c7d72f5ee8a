package loadaware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/modelmetrics"
)

// A picker over batching engines (their /metrics: 8 running, none
// waiting) gives the request to the engine picked longest ago among
// those a request apart, and leaves out one whose successes came back
// three times slower per token: the counts, turns and pace it ranks come
// from its own tracker, the batch from the scraped metrics.
func TestPickerTakesTurnsBetweenBatchesButNotOnASlowerOne(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running 8\nvllm:num_requests_waiting 0\n"))
	})
	var set []lb.Backend
	for range 3 {
		srv := httptest.NewServer(metrics)
		t.Cleanup(srv.Close)
		u, _ := url.Parse(srv.URL)
		set = append(set, lb.Backend{Dial: u.Host, URL: srv.URL})
	}
	a, b, c := set[0].Dial, set[1].Dial, set[2].Dial
	p := NewPicker(PickerConfig{Metrics: modelmetrics.Config{Interval: 50 * time.Millisecond}})
	p.SetBackends(set)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)
	for _, addr := range []string{a, b, c} {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, f := p.Scraper().Get(addr); f == modelmetrics.Fresh {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never scraped", addr)
			}
		}
	}
	// Paces: b answers 3× slower per token than a and c.
	for _, addr := range []string{a, b, c} {
		total := time.Second
		if addr == b {
			total = 3 * time.Second
		}
		p.Tracker().AcquireCost(addr, 100).Release(lb.Outcome{Kind: lb.Success, Total: total})
	}
	// In flight: b 5 (picked longest ago), c 5, a 4 (picked last).
	var held []lb.Lease
	hold := func(addr string, n int) {
		for range n {
			held = append(held, p.Tracker().AcquireCost(addr, 100))
		}
	}
	hold(b, 5)
	hold(c, 5)
	hold(a, 4)
	defer func() {
		for _, l := range held {
			l.Release(lb.Outcome{Kind: lb.Cancelled})
		}
	}()
	pick := func() string {
		l, err := p.Pick(ctx, &lb.Request{Tokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		return l.Replica()
	}
	if got := pick(); got != c {
		t.Fatalf("picked %s, want c %s: a request above the least and picked before a; b %s is 3× slower", got, c, b)
	}
	// Now a 4, c 6: c is out of the band, a the least.
	if got := pick(); got != a {
		t.Fatalf("picked %s, want a %s", got, a)
	}
}
