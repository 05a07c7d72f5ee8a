package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// requestState is what Sluice keeps for one request besides the routing
// decision's variables: the parsed body (requestInfo) and each policy's
// attempt record (usually one).
//
// It lives in the request's Replacer (one entry, requestStateKey), not in
// its variables: Caddy's vars map holds 8 entries before it grows (a
// rehash and ~600 B in 4 more allocations, on every request), and
// Caddy's own 4 (trusted_proxy, client_ip, start_time,
// proxy_protocol_info) with the decision's 4 (decision.go) fill it. The
// Replacer, like the vars map, is one per request, shared by every clone
// of it (a retry, a second reverse_proxy in handle_response), and it is
// safe for concurrent use. Without a Replacer (outside Caddy's handler
// chain) the state falls back to the vars map; without either, each
// lookup makes a fresh one, as a missing vars map did before.
//
// Only the request's goroutine reads or changes a requestState (Select,
// flow_control's handler).
type requestState struct {
	info     *requestInfo
	attempts []keyedAttempt
	// Storage for the usual case, one allocation for the request: one
	// policy's attempt record.
	attempt0 attempt
	first    [1]keyedAttempt
	// info0, if set, is where the parsed body goes (same allocation).
	info0 *requestInfo
	// body is the client's body as custom_router passes it on (see
	// keptBody); unused without that handler.
	body keptBody
	// out is the client's writer as a Sluice handler passes it on
	// (bodyWatch); unused without such a handler.
	out bodyWatch
}

type keyedAttempt struct {
	key string
	a   *attempt
}

// requestStateKey names the state in the Replacer (or the vars map).
const requestStateKey = "sluice.internal.request"

// requestStateFor returns r's state, creating it on first use, and r's
// Replacer (nil outside Caddy's handler chain).
func requestStateFor(r *http.Request) (*requestState, *caddy.Replacer) {
	return requestStateOf(r, false)
}

// requestStateWithInfo is a request's state and its parsed body in one
// allocation, for requests whose body a Sluice module reads.
type requestStateWithInfo struct {
	requestState
	info requestInfo
}

// newRequestState is a fresh state; withInfo: with room for the parsed
// body (not carried by every request: a policy that never reads the body
// would only add its bytes to the garbage).
func newRequestState(withInfo bool) *requestState {
	if !withInfo {
		return &requestState{}
	}
	s := &requestStateWithInfo{}
	s.info0 = &s.info
	return &s.requestState
}

// requestStateOf is requestStateFor; a state it creates has room for the
// parsed body when withInfo (the caller will read it).
func requestStateOf(r *http.Request, withInfo bool) (*requestState, *caddy.Replacer) {
	ctx := r.Context()
	repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl != nil {
		if v, ok := repl.Get(requestStateKey); ok {
			if rs, ok := v.(*requestState); ok {
				return rs, repl
			}
		}
		rs := newRequestState(withInfo)
		repl.Set(requestStateKey, rs)
		return rs, repl
	}
	if rs, ok := caddyhttp.GetVar(ctx, requestStateKey).(*requestState); ok {
		return rs, nil
	}
	rs := newRequestState(withInfo)
	caddyhttp.SetVar(ctx, requestStateKey, rs)
	return rs, nil
}

// attempt is the policy's attempt record keyed by key, or nil.
func (rs *requestState) attempt(key string) *attempt {
	for _, ka := range rs.attempts {
		if ka.key == key {
			return ka.a
		}
	}
	return nil
}

// newAttempt is a fresh attempt record, in rs's own storage if unused.
func (rs *requestState) newAttempt() *attempt {
	if len(rs.attempts) == 0 {
		return &rs.attempt0
	}
	return &attempt{}
}

func (rs *requestState) addAttempt(key string, a *attempt) {
	if rs.attempts == nil {
		rs.attempts = rs.first[:0]
	}
	rs.attempts = append(rs.attempts, keyedAttempt{key, a})
}
