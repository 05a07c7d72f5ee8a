package lb

import (
	"context"
	"encoding/json"
	"slices"
	"time"
)

// Picker is one load-balancing policy's state for one pool: what the
// Caddy adapter calls for every request, the same for every policy.
// Implementations are safe for concurrent use and outlive config reloads
// (the adapter keeps them in a registry keyed by module and pool).
type Picker interface {
	// SetReplicas makes addrs (dial addresses, host:port) the pool's
	// replicas. Replicas that stay keep their state; a removed replica is
	// never picked again, and its leases still release exactly once.
	SetReplicas(addrs []string)
	// Pick chooses a replica for req and takes a slot on it. A queueing
	// policy may block until a replica frees up; Pick returns ctx.Err()
	// when ctx ends first, or one of the errors in outcome.go when the
	// policy refuses the request.
	Pick(ctx context.Context, req *Request) (Lease, error)
	// InFlight is the policy's own count of leases not yet released, per
	// replica (replicas with none may be left out).
	InFlight() map[string]int
}

// Lease is one dispatched attempt on one replica.
type Lease interface {
	// Replica is the dial address the attempt goes to.
	Replica() string
	// Release ends the attempt with its outcome. Only the first call
	// counts; it returns true for that one.
	Release(Outcome) bool
}

// FirstByter is implemented by leases that learn from the moment the
// replica's response began (its first byte), before the attempt ends:
// a batching engine answers its first token while the rest of its batch
// runs, which tells a policy that it has room long before a generation of
// seconds completes. Called at most once per lease, before Release.
type FirstByter interface {
	FirstByte(latency time.Duration)
}

// ProxyViewer is implemented by pickers that hold requests while the
// proxy has replicas unavailable (Request.Unavailable, Request.Full):
// they read the proxy's view again on their own schedule — when a
// request ends, and while requests wait — rather than only when a new
// request brings it, so a waiting request sees a replica come back.
// view must be cheap and safe to call from any goroutine.
type ProxyViewer interface {
	SetProxyView(view func() (unavailable, full []string))
}

// RetryAfterer is implemented by pickers that can tell a refused client
// how long to wait (e.g. a queue's mean service time).
type RetryAfterer interface {
	RetryAfter() time.Duration
}

// Request is what a policy may know of a request when it picks.
type Request struct {
	// Model and Text come from the body (Text is the prompt as one string);
	// Parsed is false when the body was not a readable inference request.
	Model  string
	Text   string
	Parsed bool
	// Messages are a chat request's messages as sent (raw JSON), for a
	// policy that asks the engine to tokenize them; nil otherwise.
	Messages []json.RawMessage
	// TokenIDs: the prompt was given as token ids, which Text holds in
	// decimal, space-separated (several prompts joined by "\n").
	TokenIDs bool
	// Tokens estimates the request's size: prompt plus the output it may
	// generate (see EstimateTokens).
	Tokens int64
	// Session is the client's session token, if it sent one.
	Session string
	// CacheSalt is the request's cache_salt (vLLM): the engine reuses only
	// blocks cached under the same salt.
	CacheSalt string
	// Unavailable lists replicas the proxy itself will not use right now
	// (Caddy's active or passive health checks, max_requests). A policy
	// never picks them.
	Unavailable []string
	// Full lists the replicas of Unavailable that are only at the proxy's
	// request limit (Caddy's max_requests, unhealthy_request_count): busy,
	// not down. A policy that queues waits for them; one that does not
	// treats them like the rest of Unavailable.
	Full []string
	// Avoid lists replicas that already failed this request (a retry):
	// a policy treats them like Unavailable for this request only (the
	// adapter asks again without Avoid when that leaves nothing). Unlike
	// Unavailable it says nothing about other requests.
	Avoid []string
	// Attempt counts this request's earlier attempts (0: the first pick;
	// more: a retry after a failed attempt).
	Attempt int
	// Memo is the policy's own per-request state, kept across retries of
	// the same request (e.g. a fallback order).
	Memo any
	// Reason is set by a successful Pick: why it chose the replica (one
	// of the Reason constants, reason.go), for logs and headers.
	Reason string
	// Waiter, if set, is told when the pick is about to wait in the
	// policy's queue: once, on the picking goroutine, under no lock. The
	// adapter reads the client's body then: net/http notices an HTTP/1
	// client that hung up only once its body is read, and until then a
	// queued request's context does not end when its client leaves.
	Waiter Waiter
}

// Waiter is told that a pick waits in a queue (Request.Waiter), on the
// pick's goroutine before it waits. left is done once the pick leaves the
// queue without a replica (timed out, evicted, shut down), never once it
// got one: a Waiting that blocks (the adapter reads the client's body)
// must then return promptly, the pick's refusal waits for it.
type Waiter interface{ Waiting(left context.Context) }

// Excluded reports whether addr may not be picked for this request: it
// is in Unavailable or in Avoid.
func (r *Request) Excluded(addr string) bool {
	return slices.Contains(r.Unavailable, addr) || slices.Contains(r.Avoid, addr)
}

// IsUnavailable reports whether addr is in r.Unavailable.
func (r *Request) IsUnavailable(addr string) bool { return slices.Contains(r.Unavailable, addr) }
