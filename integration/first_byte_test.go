package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// The automatic first_byte_timeout is there for a replica that accepts
// requests and answers none. It must never cut a healthy replica's slow
// answer: the client would get 504 after the engine did the work, and the
// replica would be counted as failed. These replicas are slow the way
// engines are (a long generation answered whole, a queue in the engine),
// and each test waits past the automatic limit's 10 s floor once.

// lbSite serves :port with load_aware (which sends every request at once,
// no queue at the edge) over the replica at addr, with Sluice's defaults.
func lbSite(port int, pool, addr string) string {
	return globals + fmt.Sprintf(`
:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		lb_policy load_aware {
			pool %s
		}
	}
}
`, port, addr, pool)
}

func post(url, body string) (int, string, error) {
	resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// A replica whose streamed answers begin at once (vLLM, SGLang and TGI
// send the headers before the first token) has a usual time to first byte
// of about nothing; a request it answers whole (no "stream") has its first
// byte when the whole generation is done. That one must not be held to
// the streams' usual time: a long completion, alone on the replica, was
// cut at the 10 s floor.
func TestAWholeAnswerIsNotHeldToTheStreamsFirstBytes(t *testing.T) {
	const wholeTakes = 11 * time.Second
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			io.WriteString(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		select {
		case <-time.After(wholeTakes):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"text":"a long answer"}]}`)
	}))
	defer replica.Close()
	addr := strings.TrimPrefix(replica.URL, "http://")
	startCaddy(t, lbSite(9915, "first-byte-whole", addr))
	url := "http://127.0.0.1:9915"
	for i := 0; i < 20; i++ {
		if status, _, err := post(url, `{"prompt":"hi","max_tokens":1,"stream":true}`); err != nil || status != 200 {
			t.Fatalf("streamed request %d: %d %v", i, status, err)
		}
	}
	start := time.Now()
	status, body, err := post(url, `{"prompt":"write a long story","max_tokens":2000}`)
	if err != nil || status != 200 {
		t.Fatalf("a whole answer of %s after streamed ones: %d %q %v after %s, want 200", wholeTakes, status, body, err, time.Since(start).Round(time.Millisecond))
	}
}

// A replica that starts each answer at its first token and serves one
// request at a time (an engine with a queue) answers a burst in turn: the
// last of it waits in the engine past 20× the usual first byte and past
// the 10 s floor, while the replica answers the others all along. It was
// cut (504) and the replica counted as failed; a replica answering other
// requests is alive, and its queue is no reason to abandon one.
func TestABurstQueuedInALiveReplicaIsNotCut(t *testing.T) {
	const each, burst = 1 * time.Second, 12
	var mu sync.Mutex
	slow := false
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock() // one at a time, as an engine's queue
		defer mu.Unlock()
		if slow {
			select {
			case <-time.After(each):
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"text":"x"}]}`)
	}))
	defer replica.Close()
	addr := strings.TrimPrefix(replica.URL, "http://")
	startCaddy(t, lbSite(9916, "first-byte-burst", addr))
	url := "http://127.0.0.1:9916"
	for i := 0; i < 20; i++ {
		if status, _, err := post(url, `{"prompt":"hi","max_tokens":1}`); err != nil || status != 200 {
			t.Fatalf("warm-up request %d: %d %v", i, status, err)
		}
	}
	mu.Lock()
	slow = true
	mu.Unlock()
	type result struct {
		status int
		took   time.Duration
		err    error
	}
	results := make(chan result, burst)
	for i := 0; i < burst; i++ {
		go func() {
			start := time.Now()
			status, _, err := post(url, `{"prompt":"hi","max_tokens":1}`)
			results <- result{status, time.Since(start), err}
		}()
	}
	var bad []string
	for i := 0; i < burst; i++ {
		r := <-results
		if r.err != nil || r.status != 200 {
			bad = append(bad, fmt.Sprintf("%d %v after %s", r.status, r.err, r.took.Round(time.Millisecond)))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%d of a burst of %d queued in a live replica failed: %v", len(bad), burst, bad)
	}
}
