package bench

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/sim"
)

// A request lost to a Caddy reload (burst-scaleup's caddy_least_conn_reload)
// is that system's own behaviour: it stays in the lost count and is noted,
// but the run stays clean, so a Sluice system's loss is not drowned in it.
// Any other loss still fails the run.
func TestReloadRaceLossIsNotedNotFailed(t *testing.T) {
	run := func(t *testing.T, explain bool) (*runner, Summary) {
		// The second request on the kept-alive connection is read and
		// the connection closed unanswered, as an old config's server
		// closes its idle connections while a request is being written.
		var n atomic.Int32
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if n.Add(1) == 2 {
				c, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					c.Close()
				}
				return
			}
			io.WriteString(w, `{"choices":[{"text":"ok"}]}`)
		})}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		r := &runner{ctx: t.Context(), log: io.Discard, procs: &procs{}, infra: &procs{}, res: &Result{}, why: map[string]string{}}
		spec := sysSpec{name: "caddy_reload",
			start: func([]*sim.Server) ([]string, error) { return []string{"http://" + ln.Addr().String()}, nil },
			load: func(_ []*sim.Server, proxies []string) workload {
				return workload{arrivals: []time.Duration{0, 100 * time.Millisecond}, build: func(int) (*http.Request, int) {
					req, _ := http.NewRequest(http.MethodPost, proxies[0]+"/v1/completions", strings.NewReader(`{"prompt":"x"}`))
					return req, 0
				}}
			}}
		if explain {
			spec = withReloadLosses(50*time.Millisecond, spec)
		}
		r.system(spec)
		if len(r.res.Systems) != 1 {
			t.Fatalf("systems %+v, failures %v", r.res.Systems, r.res.Failures)
		}
		return r, r.res.Systems[0]
	}
	t.Run("explained", func(t *testing.T) {
		r, sum := run(t, true)
		if sum.Lost != 1 || sum.OK != 1 {
			t.Fatalf("lost %d ok %d: the lost request must still be counted", sum.Lost, sum.OK)
		}
		if len(r.res.Failures) != 0 {
			t.Fatalf("failures %v: a reload's lost request is the compared system's, not the run's", r.res.Failures)
		}
		if len(sum.Notes) != 1 || !strings.HasPrefix(sum.Notes[0], "1 lost: written on a kept-alive connection the reload closed") {
			t.Fatalf("notes %q", sum.Notes)
		}
	})
	t.Run("unexplained", func(t *testing.T) {
		r, sum := run(t, false)
		if sum.Lost != 1 || len(r.res.Failures) != 1 || !strings.Contains(r.res.Failures[0], "1 requests lost") {
			t.Fatalf("lost %d, failures %v: any other loss fails the run", sum.Lost, r.res.Failures)
		}
	})
}

// Only a written request that read EOF on a kept-alive connection within
// the reload's grace period is the reload's.
func TestReloadRaceLossIsNarrow(t *testing.T) {
	const at = 2 * time.Second
	written := lostConn{KeptAlive: true, Written: true, EOF: true}
	for _, c := range []struct {
		name string
		rec  Record
		want bool
	}{
		{"the reload's", Record{Start: at + 2*time.Millisecond, LostOn: written}, true},
		{"before the reload", Record{Start: at - time.Millisecond, LostOn: written}, false},
		{"after its grace period", Record{Start: at + caddyGracePeriod + time.Millisecond, LostOn: written}, false},
		{"answered", Record{Start: at, Status: 200, LostOn: written}, false},
		{"a new connection", Record{Start: at, LostOn: lostConn{Written: true, EOF: true}}, false},
		{"not written", Record{Start: at, LostOn: lostConn{KeptAlive: true, EOF: true}}, false},
		{"refused", Record{Start: at}, false},
		{"a timeout", Record{Start: at, LostOn: lostConn{KeptAlive: true, Written: true}}, false},
	} {
		if _, got := reloadRaceLoss(c.rec, at); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
