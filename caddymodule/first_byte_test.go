package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/sluice-router/sluice/lb"
)

// A pool whose replicas keep changing (autoscaling, set-backends) keeps a
// first-byte record only for the replicas it has now: every address ever
// picked used to stay in the state's map for the life of the process.
func TestFirstByteRecordsOnlyForTheReplicasOfTheSet(t *testing.T) {
	cctx := provisionContext(t)
	p := &CacheAware{Pool: freshPoolName("first-byte-churn")}
	if err := p.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	for i := range 200 {
		selectOnce(t, p, fmt.Sprintf("127.0.0.1:%d", 20000+i), fmt.Sprintf("127.0.0.1:%d", 20000+i+1))
	}
	var kept []string
	p.state.firstByte.m.Range(func(k, _ any) bool { kept = append(kept, k.(string)); return true })
	if len(kept) > 2 {
		t.Fatalf("%d first-byte records after 200 sets of 2 replicas, want at most the current 2 (first: %v)", len(kept), kept[:3])
	}
}

// selectOnce runs p's Select for one tiny completion over static
// upstreams dials, ends the request, and returns the headers Select set
// on the response.
func selectOnce(t *testing.T, p reverseproxy.Selector, dials ...string) http.Header {
	t.Helper()
	pool := make(reverseproxy.UpstreamPool, len(dials))
	for i, d := range dials {
		pool[i] = &reverseproxy.Upstream{Dial: d, Host: new(reverseproxy.Host)}
	}
	repl := caddy.NewReplacer()
	ctx, end := context.WithCancel(context.WithValue(context.Background(), caddy.ReplacerCtxKey, repl))
	defer end()
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1/v1/completions",
		strings.NewReader(`{"prompt":"x","max_tokens":1}`))
	w := &benchWriter{h: http.Header{}}
	if up := p.Select(pool, r, w); up == nil {
		t.Fatalf("no upstream among %v", dials)
	}
	return w.h
}

// Each kind of answer has its own usual time to first byte: a streamed
// answer's first byte is its start, a whole one's its end. Held to the
// streams' usual time, a long answer sent whole was cut at the floor.
func TestUsualFirstByteIsPerKindOfAnswer(t *testing.T) {
	u := new(firstByteUsual)
	for range 20 {
		u.observe(time.Millisecond, true, time.Now())
	}
	if got, auto := u.limit(0, true); got != firstByteMin || !auto {
		t.Fatalf("streamed after fast streamed first bytes: %v (automatic %v), want the floor %v", got, auto, firstByteMin)
	}
	if got, _ := u.limit(0, false); got != firstByteUnknown {
		t.Fatalf("a whole answer after streamed ones only: limit %v, want %v (none of its kind seen)", got, firstByteUnknown)
	}
	for range 40 {
		u.observe(30*time.Second, false, time.Now())
	}
	if got, _ := u.limit(0, false); got < 9*time.Minute {
		t.Fatalf("a whole answer after 30 s whole ones: limit %v, want about 20× 30 s", got)
	}
	if got, _ := u.limit(0, true); got != firstByteMin {
		t.Fatalf("streamed after slow whole answers: limit %v, want still the floor %v", got, firstByteMin)
	}
}

// The automatic limit abandons an attempt only once its replica has sent
// no first byte, to any request, for the whole limit: a replica that
// answers others is alive and the attempt merely waits in its queue. A
// configured limit stays a hard one.
func TestAutomaticFirstByteLimitWaitsForTheReplicasSilence(t *testing.T) {
	usual := new(firstByteUsual)
	begin := func(rule firstByteRule) (*http.Request, *recordingLease, context.CancelFunc) {
		r, _, cancel := newRequest(t)
		a := attemptFor(r, "k", measureLastByte)
		l := &recordingLease{addr: "r:1"}
		if !a.begin(l, r, rule) {
			t.Fatal("begin refused a live request")
		}
		return r, l, cancel
	}
	const limit = 20 * time.Millisecond
	// The replica answers other requests until answering (one answer
	// stamped then stands for answers all along).
	answering := time.Now().Add(time.Second)
	usual.observe(time.Millisecond, false, answering)
	rAuto, lAuto, cancelAuto := begin(firstByteRule{limit: limit, auto: true, usual: usual})
	rHard, lHard, cancelHard := begin(firstByteRule{limit: limit, usual: usual})

	waitDone := func(r *http.Request, what string) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s was not abandoned", what)
		}
		if err := r.Context().Err(); !errors.Is(err, errFirstByteTimeout) {
			t.Fatalf("%s ended with %v, want the first-byte timeout", what, err)
		}
	}
	waitDone(rHard, "the attempt under a configured limit")
	if time.Now().Before(answering) && rAuto.Context().Err() != nil {
		t.Fatalf("the automatic limit abandoned an attempt while its replica answered others: %v", rAuto.Context().Err())
	}
	waitDone(rAuto, "the attempt under the automatic limit, its replica silent")
	if now := time.Now(); now.Before(answering.Add(limit)) {
		t.Fatalf("abandoned %v before the replica had been silent for its limit", answering.Add(limit).Sub(now))
	}
	cancelAuto()
	cancelHard()
	for _, l := range []*recordingLease{lAuto, lHard} {
		if got := waitOutcomes(t, l, 1); got[0].Kind != lb.Failure {
			t.Fatalf("released %+v, want the replica's failure", got[0])
		}
	}
}

// A replica that answers nothing but errors (a dead engine behind a live
// HTTP server answers 503 at once) is not alive for the automatic limit:
// its fast error answers kept the attempts hung on it waiting, each probe
// of its passive health counting as a sign of life.
func TestErrorAnswersAreNoSignOfLife(t *testing.T) {
	usual := new(firstByteUsual)
	const limit = 20 * time.Millisecond
	hungR, _, _ := newRequest(t)
	hung := attemptFor(hungR, "k", measureLastByte)
	hungLease := &recordingLease{addr: "r:1"}
	if !hung.begin(hungLease, hungR, firstByteRule{limit: limit, auto: true, usual: usual}) {
		t.Fatal("begin refused a live request")
	}
	// The replica answers others all along, with errors only.
	var answering atomic.Bool
	answering.Store(true)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer answering.Store(false)
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			r, repl, cancel := newRequest(t)
			a := attemptFor(r, "k", measureLastByte)
			probe := &recordingLease{addr: "r:1"}
			if !a.begin(probe, r, firstByteRule{limit: time.Hour, auto: true, usual: usual}) {
				t.Error("begin refused a live request")
				return
			}
			a.trace.hooks.GotFirstResponseByte()
			// What reverse_proxy sets once the replica's 503 is in.
			repl.Set(keyHostport, "r:1")
			repl.Set(keyStatus, http.StatusServiceUnavailable)
			cancel()
			if got := waitOutcomes(t, probe, 1); got[0].Kind != lb.Failure {
				t.Errorf("the 503 was released as %+v, want a failure", got[0])
				return
			}
		}
	}()
	select {
	case <-hungR.Context().Done():
	case <-time.After(3 * time.Second):
	}
	stillAnswering := answering.Load()
	close(stop)
	<-done
	if hungR.Context().Err() == nil || !stillAnswering {
		t.Fatalf("the hung attempt was not abandoned while its replica answered only errors (ended: %v)", hungR.Context().Err())
	}
}

// observe is a first byte d of an answer of the given kind, sent at at, as
// an attempt's hook and release teach it.
func (u *firstByteUsual) observe(d time.Duration, streamed bool, at time.Time) {
	u.answered(at)
	u.learn(d, streamed)
}
