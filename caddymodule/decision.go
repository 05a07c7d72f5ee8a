package caddymodule

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// A routing decision is made visible two ways (docs/api.md#routing-decisions):
// request variables, which Caddy's `header` directive and its access log
// (`log_append`) read as placeholders ({http.vars.sluice.replica} …), and
// one line per decision on the module's own logger at DEBUG level, the
// level Caddy's reverse_proxy logs its own upstream choice at.
//
// The variables are written on the request's goroutine only (Select and
// flow_control's handler), as Caddy's vars map requires.
const (
	// varReplica: the dial address of the replica the last attempt went
	// to; absent when the request was refused.
	varReplica = "sluice.replica"
	// varReason: why (lb.Reason*), "refused:<error type>", or "cancelled"
	// when the client left before a replica was picked.
	varReason = "sluice.reason"
	// varQueueWait: a time.Duration, the time the request spent in Sluice
	// before its replica was picked (flow_control's queue, then every
	// attempt's pick). The access log writes it like its own `duration`
	// (seconds by default); a header reads like 1.5s.
	varQueueWait = "sluice.queue_wait"
	// varTenant and varBand: flow_control's fairness id (empty unless a
	// trusted source sent one) and priority band.
	varTenant = "sluice.tenant"
	varBand   = "sluice.band"
	// varAttempt: which attempt of the request got the replica (1: the
	// first; more after reverse_proxy's retries).
	varAttempt = "sluice.attempt"
)

// reasonCancelled is the reason when the client left while Sluice held
// the request: nobody was answered.
const reasonCancelled = "cancelled"

// refusedReason is the reason of a refusal of the given type.
func refusedReason(typ string) string { return "refused:" + typ }

// requestVars is r's variable table, nil outside Caddy's handler chain:
// looked up once per Select, where each caddyhttp.GetVar and SetVar walks
// the request's context chain again.
func requestVars(r *http.Request) map[string]any {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	return vars
}

// setVar is caddyhttp.SetVar on a table already looked up: nil removes
// the key if present (and stores nil otherwise, as SetVar does).
func setVar(vars map[string]any, key string, value any) {
	if vars == nil {
		return
	}
	if value == nil {
		if _, ok := vars[key]; ok {
			delete(vars, key)
			return
		}
	}
	vars[key] = value
}

// addQueueWait adds d to the request's time in Sluice and returns the
// total.
func addQueueWait(vars map[string]any, d time.Duration) time.Duration {
	total, _ := vars[varQueueWait].(time.Duration)
	total += d
	setVar(vars, varQueueWait, total)
	return total
}

// recordDecision sets the decision's variables: replica "" (a refusal or
// a client that left) removes the previous attempt's, so the variables
// always describe the last attempt.
func recordDecision(vars map[string]any, replica, reason string, attempt int) {
	if replica == "" {
		setVar(vars, varReplica, nil)
	} else {
		setVar(vars, varReplica, internedValues.of(replica))
	}
	setVar(vars, varReason, internedValues.of(reason))
	setVar(vars, varAttempt, attempt)
}

// recordFlow sets the tenant and band flow_control admitted (or refused)
// the request under.
func recordFlow(vars map[string]any, tenant, band string) {
	setVar(vars, varTenant, tenant)
	setVar(vars, varBand, band)
}

// internedValues holds the decision variables' string values (replica
// addresses, reasons) as interface values, so that setting one per
// request does not allocate: a string stored in an `any` is copied to
// the heap each time. Bounded: past maxInterned distinct strings (a pool
// whose replica addresses keep changing), the rest are stored as they
// come.
var internedValues internTable

const maxInterned = 4096

type internTable struct {
	m  atomic.Pointer[map[string]any] // copied on write
	mu sync.Mutex
}

func (t *internTable) of(s string) any {
	if m := t.m.Load(); m != nil {
		if v, ok := (*m)[s]; ok {
			return v
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.m.Load()
	if old != nil {
		if v, ok := (*old)[s]; ok {
			return v
		}
		if len(*old) >= maxInterned {
			return s
		}
	}
	next := make(map[string]any, 1+mapLen(old))
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	s = strings.Clone(s) // not a substring pinning a larger one
	v := any(s)
	next[s] = v
	t.m.Store(&next)
	return v
}

func mapLen(m *map[string]any) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// logDecision writes the decision's debug line from the variables, if
// the logger is at DEBUG; err is a refusal's cause.
func logDecision(log *zap.Logger, r *http.Request, pool string, err error) {
	c := log.Check(zap.DebugLevel, "routing decision")
	if c == nil {
		return
	}
	vars := requestVars(r)
	str := func(key string) string { s, _ := vars[key].(string); return s }
	wait, _ := vars[varQueueWait].(time.Duration)
	attempt, _ := vars[varAttempt].(int)
	fields := []zap.Field{zap.String("pool", pool), zap.String("replica", str(varReplica)),
		zap.String("reason", str(varReason)), zap.Duration("queue_wait", wait),
		zap.String("tenant", str(varTenant)), zap.String("band", str(varBand)), zap.Int("attempt", attempt)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	c.Write(fields...)
}
