package modelmetrics

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeReplica serves a metrics body and status that the test changes.
type fakeReplica struct {
	*httptest.Server
	body   atomic.Pointer[string]
	status atomic.Int64
	hits   atomic.Int64
}

func newFakeReplica(t *testing.T, body string) *fakeReplica {
	f := &fakeReplica{}
	f.set(body)
	f.status.Store(http.StatusOK)
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(f.status.Load()))
		_, _ = w.Write([]byte(*f.body.Load()))
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeReplica) set(body string) { f.body.Store(&body) }

func vllmBody(waiting, running int, kv float64) string {
	return fmt.Sprintf("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %d\n"+
		"vllm:num_requests_running{model_name=\"m\"} %d\nvllm:kv_cache_usage_perc{model_name=\"m\"} %g\n", waiting, running, kv)
}

// waitFor polls cond; the deadline only keeps a broken build from hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// run starts s.Run and returns a stop function that cancels it and checks
// that it returns.
func run(t *testing.T, s *Scraper) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not return after its context was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// scrapeOnce runs one synchronous round over all targets, without Run.
func scrapeOnce(s *Scraper) {
	var wg sync.WaitGroup
	s.round(context.Background(), &wg, nil)
	wg.Wait()
}

func TestLiveValuesUpdateAndFailuresAreStale(t *testing.T) {
	f := newFakeReplica(t, vllmBody(3, 2, 0.5))
	// A timeout no loaded test machine reaches: by default it is half the
	// interval (2.5 ms), and under -race on a busy CI box a scrape timed
	// out and went stale before the 500 was ever read.
	s := New(Config{Interval: 5 * time.Millisecond, Timeout: 5 * time.Second})
	s.SetTargets(map[string]string{"a:1": f.URL})
	run(t, s)

	waitFor(t, "first values", func() bool {
		v, fr := s.Get("a:1")
		return fr == Fresh && v.Waiting == 3
	})
	if v, _ := s.Get("a:1"); v.Running != 2 || v.KVCacheUsage != 0.5 || v.Have != (Have{Waiting: true, Running: true, KVCache: true}) || v.Err != nil {
		t.Fatalf("first sample %+v", v)
	}

	f.set(vllmBody(7, 1, 0.9))
	waitFor(t, "updated values", func() bool {
		v, fr := s.Get("a:1")
		return fr == Fresh && v.Waiting == 7 && v.Running == 1 && v.KVCacheUsage == 0.9
	})

	f.status.Store(http.StatusInternalServerError)
	// Stale for the 500 itself: a sample can also go stale while a slow
	// scrape is still out.
	waitFor(t, "stale with the 500 as its error", func() bool {
		v, fr := s.Get("a:1")
		return fr == Stale && v.Err != nil && strings.Contains(v.Err.Error(), "500")
	})
	if v, _ := s.Get("a:1"); v.Waiting != 7 || v.Running != 1 {
		t.Fatalf("a stale sample keeps its last values, got %+v", v)
	}

	f.status.Store(http.StatusOK)
	waitFor(t, "fresh again", func() bool { _, fr := s.Get("a:1"); return fr == Fresh })

	f.Close()
	// A dead replica's sample carries the failed scrape's error (waited
	// for: the sample goes stale on time before a slow scrape fails).
	waitFor(t, "stale with the dead replica's error", func() bool {
		v, fr := s.Get("a:1")
		return fr == Stale && v.Err != nil
	})
	if ok, failed := s.Scrapes(); ok == 0 || failed == 0 {
		t.Fatalf("scrape counts ok %d failed %d", ok, failed)
	}
}

func TestNewTargetsAreScrapedAtOnceAndRemovedOnesForgotten(t *testing.T) {
	a := newFakeReplica(t, vllmBody(1, 1, 0.1))
	b := newFakeReplica(t, vllmBody(2, 2, 0.2))
	s := New(Config{Interval: time.Hour}) // no tick during the test: only the first round and wake-ups
	s.SetTargets(map[string]string{"a:1": a.URL})
	run(t, s)
	waitFor(t, "a scraped by the first round", func() bool { _, fr := s.Get("a:1"); return fr == Fresh })

	// A bare host:port is taken as http.
	s.SetTargets(map[string]string{"a:1": a.URL, "b:1": strings.TrimPrefix(b.URL, "http://")})
	waitFor(t, "b scraped at once", func() bool { v, fr := s.Get("b:1"); return fr == Fresh && v.Waiting == 2 })
	if n := a.hits.Load(); n != 1 {
		t.Fatalf("adding b must not rescrape a: %d scrapes", n)
	}

	s.SetTargets(map[string]string{"b:1": b.URL + "/"}) // same URL, so b keeps its sample
	if v, fr := s.Get("a:1"); fr != Unknown || v != (Sample{}) {
		t.Fatalf("removed target: %+v %v", v, fr)
	}
	if _, fr := s.Get("b:1"); fr != Fresh {
		t.Fatalf("kept target lost its sample: %v", fr)
	}
	if _, fr := s.Get("never:1"); fr != Unknown {
		t.Fatalf("unknown target: %v", fr)
	}
}

func TestValuesAgeIntoStale(t *testing.T) {
	f := newFakeReplica(t, vllmBody(1, 1, 0.1))
	var now atomic.Int64
	now.Store(time.Unix(1000, 0).UnixNano())
	s := New(Config{Interval: time.Second})
	s.now = func() time.Time { return time.Unix(0, now.Load()) }
	s.SetTargets(map[string]string{"a:1": f.URL})
	if _, fr := s.Get("a:1"); fr != Unknown {
		t.Fatalf("before any scrape: %v", fr)
	}
	scrapeOnce(s)
	if _, fr := s.Get("a:1"); fr != Fresh {
		t.Fatalf("just scraped: %v", fr)
	}
	now.Add(int64(3 * time.Second)) // exactly Staleness: still fresh
	if _, fr := s.Get("a:1"); fr != Fresh {
		t.Fatalf("at the staleness bound: %v", fr)
	}
	now.Add(1)
	if v, fr := s.Get("a:1"); fr != Stale || v.Err != nil || v.Waiting != 1 {
		t.Fatalf("past the staleness bound: %+v %v", v, fr)
	}
}

func TestFailedScrapesAreStaleWithError(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	mux := http.NewServeMux()
	mux.HandleFunc("/hang/metrics", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	mux.HandleFunc("/huge/metrics", func(w http.ResponseWriter, r *http.Request) {
		line := []byte("# padding padding padding padding padding padding padding padding\n")
		for n := 0; n <= MaxBodyBytes; n += len(line) {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
		_, _ = w.Write([]byte("vllm:num_requests_waiting 0\n"))
	})
	mux.HandleFunc("/other/metrics", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("up 1\n"))
	})
	mux.HandleFunc("/bad/metrics", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_waiting zero\n"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// The hanging target gets a short timeout, the others a long one: a
	// 4 MiB body takes a while under the race detector.
	hang := New(Config{Interval: time.Hour, Timeout: 50 * time.Millisecond})
	hang.SetTargets(map[string]string{"hang": srv.URL + "/hang"})
	scrapeOnce(hang)
	if v, fr := hang.Get("hang"); fr != Stale || v.Err == nil || !strings.Contains(v.Err.Error(), "deadline") {
		t.Errorf("hang: got %v %+v, want stale with a deadline error", fr, v)
	}
	hang.own.CloseIdleConnections()

	s := New(Config{Interval: time.Hour, Timeout: time.Minute})
	s.SetTargets(map[string]string{
		"huge": srv.URL + "/huge", "other": srv.URL + "/other",
		"bad": srv.URL + "/bad", "missing": srv.URL + "/nothing-here",
	})
	scrapeOnce(s)
	for addr, want := range map[string]string{
		"huge": "larger than", "other": ErrNoMetrics.Error(), "bad": "bad value", "missing": "404",
	} {
		v, fr := s.Get(addr)
		if fr != Stale || v.Err == nil || !strings.Contains(v.Err.Error(), want) {
			t.Errorf("%s: got %v %+v, want stale with an error containing %q", addr, fr, v, want)
		}
	}
	if !errors.Is(func() error { v, _ := s.Get("other"); return v.Err }(), ErrNoMetrics) {
		t.Error("a body without known metrics must wrap ErrNoMetrics")
	}
	if _, failed := s.Scrapes(); failed != 4 {
		t.Errorf("failed scrapes: %d", failed)
	}
	s.own.CloseIdleConnections()
}

func TestFailureKeepsLastValuesButIsStale(t *testing.T) {
	f := newFakeReplica(t, vllmBody(4, 2, 0.3))
	s := New(Config{})
	s.SetTargets(map[string]string{"a:1": f.URL})
	scrapeOnce(s)
	good, _ := s.Get("a:1")
	f.status.Store(http.StatusServiceUnavailable)
	scrapeOnce(s)
	v, fr := s.Get("a:1")
	if fr != Stale || v.Err == nil || v.Waiting != 4 || !v.At.Equal(good.At) {
		t.Fatalf("after a failure: %v %+v (last good %+v)", fr, v, good)
	}
	s.own.CloseIdleConnections()
}

func TestNoSecondScrapeOfATargetWhileOneRuns(t *testing.T) {
	entered := make(chan struct{}, 16)
	release := make(chan struct{})
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		entered <- struct{}{}
		<-release
		_, _ = w.Write([]byte(vllmBody(1, 1, 0.1)))
	}))
	defer srv.Close()
	s := New(Config{Interval: time.Hour, Timeout: time.Hour})
	s.SetTargets(map[string]string{"a:1": srv.URL})

	var wg sync.WaitGroup
	ctx := context.Background()
	s.round(ctx, &wg, nil)
	<-entered
	for range 3 {
		s.round(ctx, &wg, nil)
	}
	close(release)
	wg.Wait()
	if n := hits.Load(); n != 1 {
		t.Fatalf("%d scrapes of one target at once, want 1", n)
	}
	// Once it finished, the next round scrapes again.
	s.round(ctx, &wg, nil)
	wg.Wait()
	if n := hits.Load(); n != 2 {
		t.Fatalf("scrapes after the first finished: %d, want 2", n)
	}
	s.own.CloseIdleConnections()
}

func TestRunLeavesNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()

	f := newFakeReplica(t, vllmBody(1, 1, 0.1))
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // in flight when Run is cancelled
	}))
	s := New(Config{Interval: 5 * time.Millisecond, Timeout: time.Hour})
	s.SetTargets(map[string]string{"a:1": f.URL, "hang:1": hang.URL})
	stop := run(t, s)
	waitFor(t, "a scraped", func() bool { _, fr := s.Get("a:1"); return fr == Fresh })
	stop()
	if _, fr := s.Get("hang:1"); fr != Unknown {
		t.Fatalf("a scrape cut short by shutdown must not mark the target: %v", fr)
	}
	hang.Close()
	f.Close()

	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCollector(t *testing.T) {
	f := newFakeReplica(t, vllmBody(1, 1, 0.1))
	var now atomic.Int64
	now.Store(time.Unix(1000, 0).UnixNano())
	s := New(Config{})
	s.now = func() time.Time { return time.Unix(0, now.Load()) }
	s.SetTargets(map[string]string{"a:1": f.URL, "dead:1": "http://127.0.0.1:1"})
	scrapeOnce(s)
	now.Add(int64(1500 * time.Millisecond))

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(func() map[string]*Scraper { return map[string]*Scraper{"p": s} }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			got[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"sluice_model_metrics_scrapes_total,pool=p,result=ok":    1,
		"sluice_model_metrics_scrapes_total,pool=p,result=error": 1,
		"sluice_model_metrics_age_seconds,addr=a:1,pool=p":       1.5,
		"sluice_model_metrics_fresh,addr=a:1,pool=p":             1,
		"sluice_model_metrics_fresh,addr=dead:1,pool=p":          0,
	}
	if len(got) != len(want) {
		t.Errorf("series %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	s.own.CloseIdleConnections()
}

func TestGetDoesNotAllocate(t *testing.T) {
	f := newFakeReplica(t, vllmBody(1, 1, 0.1))
	s := New(Config{})
	s.SetTargets(map[string]string{"a:1": f.URL})
	scrapeOnce(s)
	s.own.CloseIdleConnections()
	if n := testing.AllocsPerRun(100, func() { s.Get("a:1") }); n != 0 {
		t.Fatalf("Get allocates %v times", n)
	}
}

func BenchmarkGet(b *testing.B) {
	s := New(Config{})
	targets := map[string]string{}
	for i := range 64 {
		targets[fmt.Sprintf("10.0.0.%d:8000", i)] = fmt.Sprintf("http://10.0.0.%d:8000", i)
	}
	s.SetTargets(targets)
	for _, t := range *s.targets.Load() {
		t.last.Store(&outcome{smp: Sample{Waiting: 1, Running: 2, KVCacheUsage: 0.5, Have: Have{Waiting: true, Running: true, KVCache: true}, At: time.Now().Add(time.Hour)}})
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, fr := s.Get("10.0.0.7:8000"); fr != Fresh {
				b.Fatal(fr)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, fr := s.Get("10.0.0.7:8000"); fr != Fresh {
					b.Fatal(fr)
				}
			}
		})
	})
}

func BenchmarkParseVLLM(b *testing.B) {
	body := []byte(strings.Repeat("# HELP x y\nsome_histogram_bucket{le=\"0.1\",model_name=\"m\"} 3\n", 500) + vllmNew)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Parse(body); err != nil {
			b.Fatal(err)
		}
	}
}

func TestConfigureAppliesPathAndStalenessLive(t *testing.T) {
	hits := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case hits <- r.URL.Path:
		default:
		}
		fmt.Fprintln(w, "vllm:num_requests_waiting 3")
	}))
	defer srv.Close()
	s := New(Config{Interval: time.Hour, Path: "/metrics"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	s.SetTargets(map[string]string{"r": srv.URL})
	if p := <-hits; p != "/metrics" {
		t.Fatalf("first scrape at %q", p)
	}
	s.Configure(Config{Interval: 10 * time.Millisecond, Path: "/other", Staleness: time.Hour})
	for p := range hits {
		if p == "/other" {
			break
		}
	}
	if c := s.Config(); c.Path != "/other" || c.Interval != 10*time.Millisecond || c.Staleness != time.Hour {
		t.Fatalf("config after Configure: %+v", c)
	}
}
