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

// refusalFor maps a policy's or flow control's error to the contract in
// docs/api.md: the one place statuses and types are decided. ok is false
// for a client that went away: there is nobody to answer.
func refusalFor(err error, retryAfter time.Duration) (refusal, bool) {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return refusal{}, false
	case errors.Is(err, lb.ErrNoBackends):
		return refusal{http.StatusServiceUnavailable, "no_backends", "no backends in the pool", time.Second}, true
	case errors.Is(err, lb.ErrAllDown):
		return refusal{http.StatusServiceUnavailable, "backends_down", "every backend is down: after failures, or by the proxy's own health checks; retrying shortly", retryAfter}, true
	case errors.Is(err, lb.ErrQueueFull):
		return refusal{http.StatusTooManyRequests, "queue_full", "every backend is busy and queueing is disabled", retryAfter}, true
	case errors.Is(err, lb.ErrEvicted):
		return refusal{http.StatusServiceUnavailable, "queue_evicted", "dropped from the full queue to make room for a newer request", retryAfter}, true
	case errors.Is(err, lb.ErrQueueTimeout):
		return refusal{http.StatusServiceUnavailable, "queue_timeout", "timed out waiting in the queue", retryAfter}, true
	case errors.Is(err, lb.ErrSaturated):
		return refusal{http.StatusServiceUnavailable, "pool_saturated", "every replica is at its in-flight limit", retryAfter}, true
	case errors.Is(err, flow.ErrCapacity):
		return refusal{http.StatusTooManyRequests, "flow_capacity", "the queue for this priority is full", retryAfter}, true
	case errors.Is(err, flow.ErrTTL):
		return refusal{http.StatusServiceUnavailable, "queue_ttl", "the pool stayed saturated for the request's whole time in the queue", retryAfter}, true
	case errors.Is(err, lb.ErrShutdown), errors.Is(err, flow.ErrShutdown):
		return refusal{http.StatusInternalServerError, "shutdown", "shutting down", 0}, true
	default:
		return refusal{http.StatusInternalServerError, "internal", err.Error(), 0}, true
	}
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
