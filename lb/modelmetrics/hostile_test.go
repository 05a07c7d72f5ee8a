package modelmetrics

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A replica is outside input: it may be buggy, compromised or another
// engine than configured. These tests feed the scraper what such a
// replica may answer.

// rawReplica answers every connection with resp as it is (after reading
// the request's head) and closes it: for responses net/http's server will
// not write (a long reason phrase, oversized headers).
func rawReplica(t *testing.T, resp func(conn net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if line == "\r\n" {
						break
					}
				}
				resp(c)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// maxErrShown is the most of an error's text the tests accept: what the
// replica wrote is quoted in part, not whole.
const maxErrShown = 1 << 10

func TestARedirectToAnotherHostIsAFailedScrape(t *testing.T) {
	other := newFakeReplica(t, vllmBody(0, 0, 0)) // idle: what a redirect would pass off as the replica's load
	var hits atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, other.URL+"/metrics", http.StatusFound)
	})
	// A redirect on the replica itself (older vLLM answered /metrics with
	// a 307 to /metrics/) is followed.
	mux.HandleFunc("/same/metrics", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/same/metrics/", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/same/metrics/", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(vllmBody(7, 1, 0.5)))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	s := New(Config{Interval: time.Hour, Timeout: time.Minute})
	s.SetTargets(map[string]string{"away": srv.URL, "same": srv.URL + "/same"})
	scrapeOnce(s)
	defer s.own.CloseIdleConnections()
	if v, fr := s.Get("away"); fr != Stale || v.Err == nil || !strings.Contains(v.Err.Error(), "redirect") || hits.Load() != 1 {
		t.Errorf("a redirect to another host: got %v %+v (%d hits); want stale with a redirect error", fr, v, hits.Load())
	}
	if n := other.hits.Load(); n != 0 {
		t.Errorf("the other host was scraped %d times for the replica", n)
	}
	if v, fr := s.Get("same"); fr != Fresh || v.Waiting != 7 {
		t.Errorf("a redirect on the same host: got %v %+v; want fresh with 7 waiting", fr, v)
	}
}

func TestAReplicasTextInTheStoredErrorIsBounded(t *testing.T) {
	long := strings.Repeat("\x01", 2<<20) // %q writes each as \x01: 4 bytes
	mux := http.NewServeMux()
	mux.HandleFunc("/value/metrics", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_waiting " + long + "\n"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	// A reason phrase, and a redirect's Location, just under the header
	// limit.
	reason := rawReplica(t, func(c net.Conn) {
		_, _ = c.Write([]byte("HTTP/1.1 500 " + strings.Repeat("x", 60<<10) + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
	})
	location := rawReplica(t, func(c net.Conn) {
		_, _ = c.Write([]byte("HTTP/1.1 302 Found\r\nLocation: http://elsewhere.invalid/" + strings.Repeat("y", 60<<10) +
			"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
	})

	s := New(Config{Interval: time.Hour, Timeout: time.Minute})
	s.SetTargets(map[string]string{"value": srv.URL + "/value", "reason": reason, "location": location})
	scrapeOnce(s)
	defer s.own.CloseIdleConnections()
	for _, addr := range []string{"value", "reason", "location"} {
		v, fr := s.Get(addr)
		if fr != Stale || v.Err == nil {
			t.Errorf("%s: got %v %+v, want stale with an error", addr, fr, v)
			continue
		}
		// The error is kept per replica and shown by /health.
		if n := len(v.Err.Error()); n > maxErrShown {
			t.Errorf("%s: the stored error holds %d bytes of the replica's text: %.200s…", addr, n, v.Err.Error())
		}
	}
}

func TestParseErrorQuotesABoundedValue(t *testing.T) {
	_, err := Parse([]byte("vllm:num_requests_waiting " + strings.Repeat("9", 1<<20) + "z\n"))
	if err == nil {
		t.Fatal("a malformed value parsed")
	}
	if n := len(err.Error()); n > maxErrShown {
		t.Fatalf("the error holds %d bytes: %.200s…", n, err.Error())
	}
}

func TestOversizedResponseHeadersAreAFailedScrape(t *testing.T) {
	url := rawReplica(t, func(c net.Conn) {
		body := vllmBody(1, 1, 0.1)
		_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("p", 1<<20) + "\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body))
	})
	s := New(Config{Interval: time.Hour, Timeout: time.Minute})
	s.SetTargets(map[string]string{"a": url})
	scrapeOnce(s)
	defer s.own.CloseIdleConnections()
	if v, fr := s.Get("a"); fr != Stale || v.Err == nil {
		t.Fatalf("a megabyte of headers: got %v %+v, want a failed scrape (the headers are bounded like the body)", fr, v)
	}
}

func TestATrickledBodyEndsAtTheTimeout(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_waiting 1\n"))
		for {
			w.(http.Flusher).Flush()
			select {
			case <-stop:
				return
			case <-r.Context().Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
			if _, err := w.Write([]byte("#")); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	s := New(Config{Interval: time.Hour, Timeout: 100 * time.Millisecond})
	s.SetTargets(map[string]string{"a": srv.URL})
	scrapeOnce(s) // returns: the body read is cut at the timeout
	defer s.own.CloseIdleConnections()
	if v, fr := s.Get("a"); fr != Stale || v.Err == nil || !strings.Contains(v.Err.Error(), "deadline") {
		t.Fatalf("a trickled body: got %v %+v, want stale with a deadline error", fr, v)
	}
}

func TestAGzipBombIsReadOnlyToTheBodyLimit(t *testing.T) {
	// 64 MiB of comment lines in about 64 KiB: one gzip member of 1 MiB,
	// repeated (a gzip reader reads concatenated members as one stream).
	var member bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	line := bytes.Repeat([]byte("#"), 1<<10)
	line[len(line)-1] = '\n'
	for range 1 << 10 {
		_, _ = zw.Write(line)
	}
	_ = zw.Close()
	z := bytes.Repeat(member.Bytes(), 64)
	var asked atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Store(r.Header.Get("Accept-Encoding"))
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write(z)
	}))
	defer srv.Close()
	s := New(Config{Interval: time.Hour, Timeout: time.Minute})
	s.SetTargets(map[string]string{"a": srv.URL})
	scrapeOnce(s)
	defer s.own.CloseIdleConnections()
	if v, fr := s.Get("a"); fr != Stale || v.Err == nil || !strings.Contains(v.Err.Error(), "larger than") {
		t.Fatalf("a gzip bomb (Accept-Encoding %q): got %v %+v, want stale, body too large", asked.Load(), fr, v)
	}
}

func TestParseOddButValidFormats(t *testing.T) {
	for _, tc := range []struct {
		body    string
		waiting float64
		kv      float64
	}{
		// Exponents and Go's hex floats, as Prometheus' own parser reads them.
		{"vllm:num_requests_waiting 1e3\n", 1000, 0},
		{"vllm:num_requests_waiting 0x1p3\n", 8, 0},
		{"vllm:num_requests_waiting +2\n", 2, 0},
		{"vllm:num_requests_waiting 1_000\n", 1000, 0},
		// A fraction where a count is expected is kept as it is.
		{"vllm:num_requests_waiting 0.5\n", 0.5, 0},
		// A timestamp (even an absurd one) is ignored.
		{"vllm:num_requests_waiting 3 -99999999999999999\n", 3, 0},
		// Series of one metric add up, whatever their labels.
		{distinctSeries("vllm:num_requests_waiting", "1", 1000), 1000, 0},
		// Usage: out of range is clamped; the largest series wins.
		{"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc{e=\"0\"} -5\nvllm:kv_cache_usage_perc{e=\"1\"} 0.2\n", 0, 0.2},
		{"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 150\n", 0, 1},
		{"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1e308\n", 0, 1},
	} {
		s, err := Parse([]byte(tc.body))
		if err != nil || s.Waiting != tc.waiting || s.KVCacheUsage != tc.kv {
			t.Errorf("%.80q: got %+v, %v; want waiting %v, kv %v", tc.body, s, err, tc.waiting, tc.kv)
		}
	}
	for _, bad := range []string{
		"vllm:num_requests_waiting 0x10\n", // a hex float needs its p exponent
		"vllm:num_requests_waiting -Inf\n",
		"vllm:num_requests_waiting 1e308\n",
		"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc +Inf\n",
		"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc NaN\n",
		distinctSeries("vllm:num_requests_waiting", "9e15", 2),
	} {
		if s, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%.80q: got %+v, want an error", bad, s)
		}
	}
}

// distinctSeries is n series of metric, each with its own label value,
// all of value v.
func distinctSeries(metric, v string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s{x=\"%d\"} %s\n", metric, i, v)
	}
	return b.String()
}
