package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// drive is open loop: an arrival is sent at its time even while earlier
// requests hang, so a slow proxy cannot slow the arrival process (and
// make itself look faster). The first request is held by the server
// until every later one has been answered; a closed-loop driver would
// never send those and the test would end at its guard.
func TestReviewArrivalsAreSentWhileEarlierOnesHang(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%t", ordered), func(t *testing.T) {
			const total = 8
			release := make(chan struct{})
			var others atomic.Int32
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("n") == "0" {
					<-release
				} else if others.Add(1) == total-1 {
					close(release)
				}
			})}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(ln)
			defer srv.Close()
			arrivals := make([]time.Duration, total)
			for i := range arrivals {
				arrivals[i] = time.Duration(i) * 5 * time.Millisecond
			}
			w := workload{arrivals: arrivals, ordered: ordered, build: func(n int) (*http.Request, int) {
				req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/?n=%d", ln.Addr(), n), nil)
				return req, 0
			}}
			// The guard against a closed loop: far longer than the run.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			recs, _ := drive(ctx, "t", w, time.Minute)
			for _, r := range recs {
				if r.Status != 200 {
					t.Fatalf("request %d: %+v (the later arrivals were not sent while the first hung)", r.Seq, r)
				}
				if r.Start < arrivals[r.Seq] {
					t.Fatalf("request %d sent at %v, before its arrival time %v", r.Seq, r.Start, arrivals[r.Seq])
				}
			}
			// Request 0 ended after every other one was answered.
			end0 := recs[0].Start + recs[0].Latency
			for _, r := range recs[1:] {
				if r.Start > end0 {
					t.Fatalf("request %d sent at %v, after request 0 ended at %v", r.Seq, r.Start, end0)
				}
			}
		})
	}
}
