package bench

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// With a time scale, every duration of a record is turned into engine
// time, LastToken too: out tok/s ends its window at Start + LastToken, and
// a LastToken left in real time (4× short at scale 0.25) cuts the window
// short and overstates the rate.
func TestReviewTimeScaleAppliesToLastToken(t *testing.T) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		// The tokens come together, after a wait: the first and the last
		// are read at about the same time, well after the start.
		time.Sleep(20 * time.Millisecond)
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d\"}]}\n\n", i)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	r := &runner{ctx: t.Context(), log: io.Discard, procs: &procs{}, infra: &procs{}, res: &Result{}, why: map[string]string{}}
	var all []Record
	r.system(sysSpec{name: "scaled", timeScale: 0.25,
		start: func([]*sim.Server) ([]string, error) { return []string{"http://" + ln.Addr().String()}, nil },
		load: func(_ []*sim.Server, proxies []string) workload {
			return workload{arrivals: []time.Duration{0}, sse: true, build: func(int) (*http.Request, int) {
				req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/completions", nil)
				return req, 0
			}}
		},
		after: func(_ []*sim.Server, recs []Record, _ *Summary) { all = recs }})
	if len(all) != 1 || all[0].Tokens != 3 {
		t.Fatalf("records %+v", all)
	}
	if rec := all[0]; rec.LastToken < rec.TTFT || rec.LastToken > rec.Latency {
		t.Fatalf("ttft %v, last token %v, latency %v: the last token must lie between the first and the end (in one time)",
			rec.TTFT, rec.LastToken, rec.Latency)
	}
}
