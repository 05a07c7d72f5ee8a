package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// selector is the selection-policy adapter every Sluice policy embeds:
// the attempt lifecycle (start, retry, finish), refusals, static-upstream
// sync, Caddy's upstream health, and handing back the chosen upstream are
// written here once. A policy's own file holds its config, its Caddyfile
// unmarshaler and how to build and configure its lb.Picker.
type selector struct {
	module  string
	pool    *lb.Pool
	varKey  string
	measure latencyMeasure
	maxBody int64 // > 0: the body is read (up to this) for the prompt
	// readsText, if set, says whether picks now read the prompt's text;
	// unset, they do. Without it the body is only weighed.
	readsText func() bool
	session   string // header carrying a session token, if the policy uses one
	// afterPick, if set, runs once a lease is taken (e.g. to hand the
	// client a session token).
	afterPick func(w http.ResponseWriter, l lb.Lease)
	// firstByte is the configured first-byte limit (0: auto, < 0: none).
	firstByte time.Duration
	// readAhead: a small body may be read whole before the pick even when
	// no Sluice handler keeps the client's body (body_read_ahead.go); set
	// when the config starts (a pointer: modules are copied by value).
	readAhead *atomic.Bool

	// scheme is how the enclosing reverse_proxy reaches its static
	// upstreams (their URLs, where engine metrics are read).
	scheme upstreamScheme

	state  *policyState
	claims stateClaims
	log    *zap.Logger
}

// selectorSpec is what a policy's Provision gives the adapter.
type selectorSpec struct {
	module, pool, variant string
	measure               latencyMeasure
	maxBody               int64
	readsText             func() bool
	session               string
	afterPick             func(http.ResponseWriter, lb.Lease)
	attempt               attemptOptions
	// fingerprint identifies the settings apply gives the shared state;
	// two blocks of one config that differ on a pool are refused.
	fingerprint string
	build       func(key stateKey) (*policyState, error)
	apply       func(*policyState)
}

// provision attaches the instance to its pool's shared state (built on
// first use) and queues its settings for when the config starts. It
// touches no live setting: a config Caddy refuses later changes nothing.
func (s *selector) provision(ctx caddy.Context, spec selectorSpec) error {
	s.log = ctx.Logger()
	s.module, s.measure, s.maxBody, s.session, s.afterPick = spec.module, spec.measure, spec.maxBody, spec.session, spec.afterPick
	s.readsText = spec.readsText
	s.firstByte = time.Duration(spec.attempt.FirstByteTimeout)
	proxy := enclosingProxy(ctx)
	// Before anything is claimed: a refused handler releases nothing.
	if err := checkPoolSource(ctx, spec.pool, proxy); err != nil {
		return fmt.Errorf("%s: %v", spec.module, err)
	}
	s.scheme = schemeOfProxy(proxy)
	tlsCfg := upstreamTLS(proxy) // for the state's engine reads its picker's config does not reach
	if err := usePool(ctx, spec.pool, s.log); err != nil {
		return fmt.Errorf("%s: %v", spec.module, err)
	}
	s.pool = lb.GetPool(spec.pool)
	key := stateKey{module: spec.module, pool: spec.pool, variant: spec.variant}
	s.varKey = fmt.Sprintf("sluice.%s.%s.%s", spec.module, spec.pool, spec.variant)
	v, err := s.claims.take(key, func() (sharedState, error) { return spec.build(key) })
	if err != nil {
		return fmt.Errorf("%s: %v", spec.module, err)
	}
	s.state = v.(*policyState)
	st := s.state
	if err := applyOnStart(ctx, key, spec.fingerprint, func() {
		spec.apply(st)
		if st.setTLS != nil {
			st.setTLS(tlsCfg)
		}
	}); err != nil {
		return fmt.Errorf("%s: %v", spec.module, err)
	}
	readAhead := new(atomic.Bool)
	s.readAhead = readAhead
	if err := onConfigStart(ctx, func() { readAhead.Store(readAheadSafe(ctx)) }); err != nil {
		return fmt.Errorf("%s: %v", spec.module, err)
	}
	registerMetrics(ctx, s.log)
	return nil
}

// Cleanup implements caddy.CleanerUpper: it releases exactly what
// provision took.
func (s *selector) Cleanup() error { return s.claims.release() }

// Select implements reverseproxy.Selector. It may block (a queueing
// policy). When the request cannot be dispatched it answers the client
// itself (JSON error, Retry-After) and returns nil.
func (s *selector) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) (up *reverseproxy.Upstream) {
	rs, repl := requestStateOf(r, s.maxBody > 0 || hasSmallBody(r))
	a := rs.startAttempt(r, repl, s.varKey, s.measure)
	if a == nil {
		return nil
	}
	vars := requestVars(r)
	// A panic in a policy must not take the slot it holds down with the
	// request: the lease taken but not yet handed to the attempt is
	// released, the client gets 500 with the JSON body, the log the stack.
	var lease lb.Lease
	begun := false
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		s.log.Error("panic in a Sluice policy; the request is answered 500", zap.String("pool", s.pool.Name()),
			zap.Any("panic", v), zap.Stack("stack"))
		if lease != nil && !begun {
			lease.Release(lb.Outcome{Kind: lb.Cancelled})
		}
		rf := refusal{http.StatusInternalServerError, "internal", "internal error in the load-balancing policy", 0}
		recordDecision(vars, "", refusedReason(rf.Type), attemptNumber(a))
		a.refuse(r, w, rf)
		up = nil
	}()
	st := s.state
	st.requests.enter()
	defer st.requests.leave()
	if !s.pool.Managed() {
		st.syncStatic(pool, s.scheme)
	}
	a.waitW = w
	req := s.request(rs, a, r)
	req.Unavailable, req.Full = unavailable(pool, req.Unavailable, req.Full)
	if st.view != nil {
		st.view.remember(pool)
	}
	// A retry avoids the replicas that already failed this request, or
	// whose answer reverse_proxy's retry_match sent to another (a
	// cache-aware policy would otherwise send it back where its prompt
	// was recorded), unless no other is left.
	req.Avoid = a.failed
	req.Reason = ""
	picking := time.Now()
	lease, err := st.picker.Pick(a.base, req)
	if errors.Is(err, lb.ErrAllDown) && len(req.Avoid) > 0 {
		req.Avoid = nil
		lease, err = st.picker.Pick(a.base, req)
	}
	addQueueWait(vars, time.Since(picking))
	if err != nil {
		rf, ok := refusalFor(err, retryAfter(st.picker))
		reason := reasonCancelled
		if ok {
			reason = refusedReason(rf.Type)
		}
		recordDecision(vars, "", reason, req.Attempt+1)
		logDecision(s.log, r, s.pool.Name(), err)
		if ok {
			a.refuse(r, w, rf)
		}
		return nil
	}
	if rs.info != nil {
		a.bodyWhole = rs.info.bodyFor(r)
	}
	begun = true
	known := rs.info != nil && rs.info.Parsed
	streamed := known && rs.info.Stream
	if !a.begin(lease, r, firstByteRuleFor(st.firstByte.of(lease.Replica()), s.firstByte, streamed, known)) {
		recordDecision(vars, "", reasonCancelled, req.Attempt+1) // the client left: the lease went back
		return nil
	}
	recordDecision(vars, lease.Replica(), req.Reason, req.Attempt+1)
	logDecision(s.log, r, s.pool.Name(), nil)
	if s.afterPick != nil && w != nil {
		s.afterPick(w, lease)
	}
	return upstreamFor(pool, lease.Replica())
}

// attemptNumber is the attempt Select is serving (1: the first), for the
// decision's record.
func attemptNumber(a *attempt) int {
	if a.req == nil {
		return 1
	}
	return a.req.Attempt + 1
}

// request is what the policy knows of r, built at the first attempt and
// kept (with the policy's memo) across retries.
func (s *selector) request(rs *requestState, a *attempt, r *http.Request) *lb.Request {
	a.waitReq = r
	if a.req != nil {
		a.req.Attempt++
		return a.req
	}
	req := &a.reqStore
	a.waitReads = s.readsAhead() || rs.bodyKept()
	req.Waiter = a
	if s.maxBody > 0 {
		ri := rs.requestInfoFor(r, s.maxBody, s.readsText == nil || s.readsText())
		req.Model, req.Text, req.Parsed, req.Tokens = ri.Model, ri.Text, ri.Parsed, ri.estimatedTokens()
		if ri.Parsed {
			req.Messages, req.TokenIDs, req.CacheSalt = ri.Messages, ri.TokenIDs, ri.CacheSalt
		}
	} else if hasSmallBody(r) && (s.readsAhead() || rs.bodyKept()) {
		rs.readBody(r, smallBodyBytes) // body_read_ahead.go
	}
	if s.session != "" {
		req.Session = r.Header.Get(s.session)
	}
	a.req = req
	return req
}

// readsAhead: the config lets this instance read a small body it cannot
// give back (see readAhead).
func (s *selector) readsAhead() bool { return s.readAhead != nil && s.readAhead.Load() }

// unavailable lists the upstreams Caddy itself would not use now (active
// or passive health checks, max_requests) and, of those, the ones that
// are only full (at max_requests or unhealthy_request_count: busy, not
// down), reusing the slices.
func unavailable(pool reverseproxy.UpstreamPool, down, full []string) ([]string, []string) {
	down, full = down[:0], full[:0]
	for _, u := range pool {
		if !u.Available() {
			down = append(down, u.Dial)
			if u.Healthy() {
				full = append(full, u.Dial)
			}
		}
	}
	return down, full
}

func retryAfter(pk lb.Picker) time.Duration {
	if ra, ok := pk.(lb.RetryAfterer); ok {
		return ra.RetryAfter()
	}
	return time.Second
}

// sluiceUpstreams holds upstreams for replicas a request's (stale) pool
// does not list: a request queued before set-backends added a replica can
// still be dispatched to it.
var sluiceUpstreams = &madeUpstreams{m: map[string]*reverseproxy.Upstream{}}

// maxSluiceUpstreams bounds sluiceUpstreams: replicas' addresses churn
// (pods rescheduled), and one kept per address ever seen would grow for
// the process's life. Past it the map starts over; an upstream dropped
// while a request uses it stays that request's.
const maxSluiceUpstreams = 4096

type madeUpstreams struct {
	mu sync.Mutex
	m  map[string]*reverseproxy.Upstream
}

func (s *madeUpstreams) get(dial string) *reverseproxy.Upstream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.m[dial]; u != nil {
		return u
	}
	if len(s.m) >= maxSluiceUpstreams {
		clear(s.m)
	}
	u := &reverseproxy.Upstream{Dial: dial, Host: new(reverseproxy.Host)}
	s.m[dial] = u
	return u
}

func (s *madeUpstreams) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// upstreamFor returns the pool's upstream for dial, so Caddy's own
// per-host counters and health state apply, or a Sluice-made one.
func upstreamFor(pool reverseproxy.UpstreamPool, dial string) *reverseproxy.Upstream {
	for _, u := range pool {
		if u.Dial == dial {
			return u
		}
	}
	return sluiceUpstreams.get(dial)
}

// passiveHealth are the options of Sluice's own passive health check,
// shared by the policies that keep it.
type passiveHealth struct {
	// Consecutive failures that mark a replica down (default 1), and for
	// how long (default 5s, doubling per further failure up to 16×).
	MaxFails     int            `json:"max_fails,omitempty" sluice:"min=1"`
	FailDuration caddy.Duration `json:"fail_duration,omitempty"`
}

func (h passiveHealth) trackerConfig() tracker.Config {
	return tracker.Config{MaxFails: h.MaxFails, FailDuration: time.Duration(h.FailDuration)}
}

// bodyOptions bound how much of a body the modules that read the prompt
// buffer.
type bodyOptions struct {
	// Bytes of request body buffered to read the prompt (default 4 MiB).
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty" sluice:"min=1"`
}

func (b bodyOptions) bodyLimit() int64 { return orDefault(b.MaxBodyBytes, DefaultMaxBodyBytes) }

// validateBodyAndHealth checks the shared options.
func validateBodyAndHealth(module string, b bodyOptions, h passiveHealth) error {
	switch {
	case b.MaxBodyBytes < 0:
		return fmt.Errorf("%s: max_body_bytes: must be positive, got %d", module, b.MaxBodyBytes)
	case h.MaxFails < 0:
		return fmt.Errorf("%s: max_fails: must be at least 1, got %d", module, h.MaxFails)
	case h.FailDuration < 0:
		return fmt.Errorf("%s: fail_duration: must be positive, got %s", module, time.Duration(h.FailDuration))
	}
	return nil
}

// orDefault is v, or def when v is unset (zero).
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
