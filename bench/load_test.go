package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Arrivals due at the same instant reach the server in script order when
// the workload is ordered (seed 003's one-loop client), which the Heimdall
// scenarios need for round robin to see the seed's spec cycle.
func TestOrderedArrivalsReachTheServerInScriptOrder(t *testing.T) {
	// A bare listener that accepts and reads one connection at a time, so
	// the order it records is the order connections were made (the kernel's
	// accept queue is FIFO); each request holds its connection 50 ms, so
	// every arrival needs a new one.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var seen []int
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			req, err := http.ReadRequest(bufio.NewReader(c))
			if err != nil {
				c.Close()
				continue
			}
			n, _ := strconv.Atoi(req.URL.Query().Get("n"))
			seen = append(seen, n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				time.Sleep(50 * time.Millisecond)
				fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			}()
		}
	}()
	const total = 40
	w := workload{arrivals: make([]time.Duration, total), ordered: true, // all due at t=0
		build: func(n int) (*http.Request, int) {
			req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s/?n=%d", ln.Addr(), n), nil)
			return req, 0
		}}
	recs, _ := drive(context.Background(), "t", w, 10*time.Second)
	wg.Wait()
	for _, r := range recs {
		if r.Status != 200 {
			t.Fatalf("request %d: %+v", r.Seq, r)
		}
	}
	if len(seen) != total {
		t.Fatalf("server saw %d requests, want %d", len(seen), total)
	}
	for i, n := range seen {
		if n != i {
			t.Fatalf("arrival order %v: want 0..%d in order", seen, total-1)
		}
	}
}

func TestRepTableMeanAndSD(t *testing.T) {
	r := &Result{Reps: 3, extras: []extraCol{{"makespan_s", "makespan", "%.2f s"}}}
	for i, v := range []float64{10, 12, 14} {
		r.Systems = append(r.Systems, Summary{System: "a", Rep: i + 1, OK: 1, P50: v, P99: v,
			Extra: map[string]float64{"makespan_s": v}})
	}
	r.Systems = append(r.Systems, Summary{System: "b", Rep: 1, OK: 1, P50: 1, P99: 1, Extra: map[string]float64{}})
	head, rows := repRows(r)
	if len(head) != 6 || len(rows) != 2 {
		t.Fatalf("head %v rows %v", head, rows)
	}
	if rows[0][0] != "a" || rows[0][1] != "3" || rows[0][5] != "12.00 s ± 2.00 s" {
		t.Fatalf("row a: %v (want mean 12, sample sd 2)", rows[0])
	}
	if rows[1][0] != "b" || rows[1][1] != "1" || rows[1][5] != "—" || rows[1][2] != "1.000 s ± 0.000 s" {
		t.Fatalf("row b: %v", rows[1])
	}
	if h, _ := repRows(&Result{Reps: 1}); h != nil {
		t.Fatal("one rep: no table of means")
	}
}

func TestOnlySelectsBySubstrings(t *testing.T) {
	for _, c := range []struct {
		name, only string
		want       bool
	}{
		{"caddy_least_conn", "", true},
		{"caddy_least_conn", "least", true},
		{"caddy_least_conn", "qll", false},
		{"sluice_qll", "round_robin, qll", true},
		{"haproxy_leastconn", "round_robin,,qll", false},
	} {
		if got := selected(c.name, c.only); got != c.want {
			t.Errorf("selected(%q, %q) = %v, want %v", c.name, c.only, got, c.want)
		}
	}
}

// The calibration compares the simulated engine with a measured run at
// the same number of requests: poissonGiven sends exactly n, in order,
// within the window, and the same ones for the same seed.
func TestPoissonGivenSendsExactlyTheCount(t *testing.T) {
	const d = 25 * time.Second
	a := poissonGiven(94, d, 7)
	if len(a) != 94 || !slices.IsSorted(a) || a[0] < 0 || a[len(a)-1] >= d {
		t.Fatalf("got %d arrivals from %v to %v, sorted %t; want 94 sorted within [0, %v)", len(a), a[0], a[len(a)-1], slices.IsSorted(a), d)
	}
	if b := poissonGiven(94, d, 7); !slices.Equal(a, b) {
		t.Fatal("the same seed gave other arrivals")
	}
}

// A lost request's record says how its connection went: a kept-alive one
// (and how long idle) or a new one, and whether the request was written,
// so a request lost to a server closing idle connections at a reload is
// told apart from one the proxy dropped.
func TestLostRequestSaysHowItsConnectionWent(t *testing.T) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/drop" {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second}
	url := "http://" + ln.Addr().String()
	req, _ := http.NewRequest("POST", url+"/drop", nil)
	rec := send(client, req, "t", 0, 0, time.Now(), nil, false)
	if !rec.Lost() || !strings.Contains(rec.Err, "[try 1 on a new connection, request written]") {
		t.Fatalf("first request: %+v", rec)
	}
	req, _ = http.NewRequest("POST", url+"/ok", nil)
	if rec := send(client, req, "t", 1, 0, time.Now(), nil, false); rec.Lost() {
		t.Fatalf("second request: %+v", rec)
	}
	req, _ = http.NewRequest("POST", url+"/drop", nil)
	rec = send(client, req, "t", 2, 0, time.Now(), nil, false)
	if !rec.Lost() || !strings.Contains(rec.Err, "on a kept-alive connection (idle ") {
		t.Fatalf("a request on the kept-alive connection: %+v", rec)
	}
}
