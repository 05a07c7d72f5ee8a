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

func (rf refusal) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if rf.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(rf.RetryAfter.Seconds()))))
	}
	w.WriteHeader(rf.Status)
	body := map[string]map[string]string{"error": {"type": rf.Type, "message": rf.Message}}
	_ = json.NewEncoder(w).Encode(body)
}

// writeJSONError answers an API call (set-backends etc.) with an error.
func writeJSONError(w http.ResponseWriter, status int, typ, msg string) {
	refusal{Status: status, Type: typ, Message: msg}.write(w)
}
