package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb"
)

// refusal is how Sluice answers a request it will not proxy: a status, a
// short machine-readable JSON body and, where waiting helps, Retry-After.
type refusal struct {
	Status     int
	Type       string
	Message    string
	RetryAfter time.Duration // 0: no header
}

// refusals maps every error a policy or flow control returns to its
// answer (docs/api.md): the one place statuses and types are decided.
var refusals = []struct {
	errs   []error
	status int
	typ    string
	msg    string
	wait   retryWait
}{
	{[]error{lb.ErrNoBackends}, http.StatusServiceUnavailable, "no_backends", "no backends in the pool", waitSecond},
	{[]error{lb.ErrAllDown}, http.StatusServiceUnavailable, "backends_down", "every backend is down: after failures, or by the proxy's own health checks; retrying shortly", waitEstimate},
	{[]error{lb.ErrQueueFull}, http.StatusTooManyRequests, "queue_full", "every backend is busy and queueing is disabled", waitEstimate},
	{[]error{lb.ErrEvicted}, http.StatusServiceUnavailable, "queue_evicted", "dropped from the queue: it was full and a newer request took the place, or a reload lowered queue_max_size", waitEstimate},
	{[]error{lb.ErrQueueTimeout}, http.StatusServiceUnavailable, "queue_timeout", "timed out waiting in the queue", waitEstimate},
	{[]error{lb.ErrSaturated}, http.StatusServiceUnavailable, "pool_saturated", "every replica is at its in-flight limit", waitEstimate},
	{[]error{flow.ErrCapacity}, http.StatusTooManyRequests, "flow_capacity", "the queue for this priority is full", waitEstimate},
	{[]error{flow.ErrTTL}, http.StatusServiceUnavailable, "queue_ttl", "the pool stayed saturated for the request's whole time in the queue", waitEstimate},
	{[]error{lb.ErrShutdown, flow.ErrShutdown}, http.StatusServiceUnavailable, "shutdown", "shutting down: the pool's state was replaced by a reload, or stopped, while the request waited; retry", waitSecond},
}

// retryWait says what Retry-After a refusal carries.
type retryWait int

const (
	waitNone     retryWait = iota // no header: waiting does not help
	waitSecond                    // one second
	waitEstimate                  // the policy's estimate (e.g. a queue's mean service time)
)

// refusalFor answers err; ok is false for a client that went away: there
// is nobody to answer. estimate is the policy's Retry-After estimate.
func refusalFor(err error, estimate time.Duration) (refusal, bool) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return refusal{}, false
	}
	for _, r := range refusals {
		for _, e := range r.errs {
			if errors.Is(err, e) {
				var after time.Duration
				switch r.wait {
				case waitSecond:
					after = time.Second
				case waitEstimate:
					after = estimate
				}
				return refusal{r.status, r.typ, r.msg, after}, true
			}
		}
	}
	return refusal{http.StatusInternalServerError, "internal", err.Error(), 0}, true
}

// answer writes rf as the answer to r, over HTTP/1 first bounding the
// wait for what is left of r's body. Before it writes a response, net/http
// reads what is left of a small unread request body (under 256 KiB), to
// keep the connection for the client's next request; a refusal at arrival
// (nothing read yet) to a client whose upload stalls waited for it, for
// ever. A read deadline lets a body already on its way be read, and cuts a
// stalled one, after which net/http closes the connection. The answer is
// flushed (net/http reads the rest of the body as it sends the header),
// then the deadline is cleared: the handler may
// go on (lb_try_duration), and net/http's read of a kept connection in the
// background, timed out, would be taken for the client gone and cancel
// the connection's context, every later request on it with it.
func (rf refusal) answer(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 || r.ContentLength == 0 {
		rf.write(w)
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(refusalBodyGrace))
	rf.write(w)
	_ = rc.Flush()
	_ = rc.SetReadDeadline(time.Time{})
}

// refusalBodyGrace is how long a refusal waits for the rest of an unread
// HTTP/1 request body (answer): enough for a small body already on the
// wire, short enough that a refused client never waits on its own upload.
const refusalBodyGrace = time.Second

func (rf refusal) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if rf.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(rf.RetryAfter.Seconds()))))
	}
	body, _ := json.Marshal(map[string]map[string]string{"error": {"type": rf.Type, "message": rf.Message}})
	body = append(body, '\n')
	// Sized: a flushed answer (answer) is framed as one written whole.
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(rf.Status)
	_, _ = w.Write(body)
}

// writeJSONError answers an API call (set-backends etc.) with an error.
func writeJSONError(w http.ResponseWriter, status int, typ, msg string) {
	refusal{Status: status, Type: typ, Message: msg}.write(w)
}
