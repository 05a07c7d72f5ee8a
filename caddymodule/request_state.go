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
	// keptBody), out the client's writer as a Sluice handler passes it on
	// (bodyWatch): a handlerParts, both nil until a Sluice handler needs
	// them (handlerStateOf). A plain reverse_proxy request does not carry
	// them (their 104 B took its state a size class up). Either may be
	// there and unused: bodyKept and watched say.
	body *keptBody
	out  *bodyWatch
}

// handlerParts are the parts of a request's state only a Sluice handler
// in front of reverse_proxy uses.
type handlerParts struct {
	body keptBody
	out  bodyWatch
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

// requestStateForHandler is requestStateWithInfo with a Sluice handler's
// parts, in one allocation.
type requestStateForHandler struct {
	requestStateWithInfo
	parts handlerParts
}

// stateRoom is what a new state has room for in its own allocation,
// besides one attempt record.
type stateRoom uint8

const (
	roomAttempt stateRoom = iota
	roomInfo              // the parsed body
	roomHandler           // the parsed body and a Sluice handler's parts
)

// newRequestState is a fresh state with the given room (not carried by
// every request: what a request never uses would only add its bytes to
// the garbage).
func newRequestState(room stateRoom) *requestState {
	switch room {
	case roomInfo:
		s := &requestStateWithInfo{}
		s.info0 = &s.info
		return &s.requestState
	case roomHandler:
		s := &requestStateForHandler{}
		s.info0, s.body, s.out = &s.info, &s.parts.body, &s.parts.out
		return &s.requestState
	}
	return &requestState{}
}

// requestStateOf is requestStateFor; a state it creates has room for the
// parsed body when withInfo (the caller will read it).
func requestStateOf(r *http.Request, withInfo bool) (*requestState, *caddy.Replacer) {
	room := roomAttempt
	if withInfo {
		room = roomInfo
	}
	return requestStateIn(r, room)
}

// handlerStateOf is requestStateFor for a Sluice handler in front of
// reverse_proxy: the state has the handler's parts (in its own
// allocation if this makes it, with room for the parsed body; in one of
// their own if a module that is not a Sluice handler made it first).
func handlerStateOf(r *http.Request) *requestState {
	rs, _ := requestStateIn(r, roomHandler)
	if rs.body == nil {
		p := new(handlerParts)
		rs.body, rs.out = &p.body, &p.out
	}
	return rs
}

// requestStateIn is requestStateFor; a state it creates has the given
// room.
func requestStateIn(r *http.Request, room stateRoom) (*requestState, *caddy.Replacer) {
	ctx := r.Context()
	repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl != nil {
		if v, ok := repl.Get(requestStateKey); ok {
			if rs, ok := v.(*requestState); ok {
				return rs, repl
			}
		}
		rs := newRequestState(room)
		repl.Set(requestStateKey, rs)
		return rs, repl
	}
	if rs, ok := caddyhttp.GetVar(ctx, requestStateKey).(*requestState); ok {
		return rs, nil
	}
	rs := newRequestState(room)
	caddyhttp.SetVar(ctx, requestStateKey, rs)
	return rs, nil
}

// bodyKept reports whether a Sluice handler keeps the client's body
// (keepClientBody).
func (rs *requestState) bodyKept() bool { return rs.body != nil && rs.body.ReadCloser != nil }

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
