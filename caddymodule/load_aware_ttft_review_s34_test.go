package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb/loadaware"
)

// load_aware's adaptive mode is a time-to-first-token SLO: a non-streamed
// answer's first byte comes when its whole generation is done, so it must
// not read as a slow first token (long healthy generations moved the
// weight off the affinity scorers for the whole pool); a streamed
// answer's first byte still does.
func TestLoadAwareAdaptiveModeTimesStreamedAnswersOnly(t *testing.T) {
	const answerAfter = 30 * time.Millisecond // well over the SLO below
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(answerAfter)
		if r.URL.Query().Get("stream") == "1" {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	dial := strings.TrimPrefix(srv.URL, "http://")
	pool := reverseproxy.UpstreamPool{{Dial: dial, Host: new(reverseproxy.Host)}}

	la := &LoadAware{Pool: "la-ttft-s34", SLO: caddy.Duration(5 * time.Millisecond)}
	if err := la.Provision(provisionContext(t)); err != nil {
		t.Fatal(err)
	}
	defer la.Cleanup()
	policy := la.state.picker.(*loadaware.Picker).Policy()

	send := func(stream bool) {
		t.Helper()
		r, repl, cancel := requestTo(t, srv.URL)
		if stream {
			r.URL.RawQuery = "stream=1"
		}
		if up := la.Select(pool, r, &benchWriter{h: http.Header{}}); up == nil {
			t.Fatal("no upstream")
		}
		repl.Set(keyHostport, dial)
		repl.Set(keyStatus, 200)
		ct := "application/json"
		if stream {
			ct = "text/event-stream"
		}
		repl.Set(keyContentType, ct)
		roundTripWhole(t, r)
		cancel()
	}
	for range 10 {
		send(false)
	}
	// Released (and so observed) once nothing is in flight.
	picker := la.state.picker.(*loadaware.Picker)
	deadline := time.Now().Add(5 * time.Second)
	for picker.InFlight()[dial] != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("in flight %v after every answer was read", picker.InFlight())
		}
		time.Sleep(time.Millisecond)
	}
	if s := policy.Shift(); s != 0 {
		t.Fatalf("shift %v after 10 non-streamed answers of %v under slo 5ms, want 0: no first token was timed", s, answerAfter)
	}
	for range 10 {
		send(true)
	}
	deadline = time.Now().Add(5 * time.Second)
	for policy.Shift() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("shift 0 after 10 streamed answers whose first byte came after %v under slo 5ms", answerAfter)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
