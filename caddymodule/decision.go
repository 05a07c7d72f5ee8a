package caddymodule

import (
	"net/http"
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

// addQueueWait adds d to the request's time in Sluice and returns the
// total.
func addQueueWait(r *http.Request, d time.Duration) time.Duration {
	total, _ := caddyhttp.GetVar(r.Context(), varQueueWait).(time.Duration)
	total += d
	caddyhttp.SetVar(r.Context(), varQueueWait, total)
	return total
}

// recordDecision sets the decision's variables: replica "" (a refusal or
// a client that left) removes the previous attempt's, so the variables
// always describe the last attempt.
func recordDecision(r *http.Request, replica, reason string, attempt int) {
	ctx := r.Context()
	if replica == "" {
		caddyhttp.SetVar(ctx, varReplica, nil)
	} else {
		caddyhttp.SetVar(ctx, varReplica, replica)
	}
	caddyhttp.SetVar(ctx, varReason, reason)
	caddyhttp.SetVar(ctx, varAttempt, attempt)
}

// recordFlow sets the tenant and band flow_control admitted (or refused)
// the request under.
func recordFlow(r *http.Request, tenant, band string) {
	caddyhttp.SetVar(r.Context(), varTenant, tenant)
	caddyhttp.SetVar(r.Context(), varBand, band)
}

// logDecision writes the decision's debug line from the variables, if
// the logger is at DEBUG; err is a refusal's cause.
func logDecision(log *zap.Logger, r *http.Request, pool string, err error) {
	c := log.Check(zap.DebugLevel, "routing decision")
	if c == nil {
		return
	}
	ctx := r.Context()
	str := func(key string) string { s, _ := caddyhttp.GetVar(ctx, key).(string); return s }
	wait, _ := caddyhttp.GetVar(ctx, varQueueWait).(time.Duration)
	attempt, _ := caddyhttp.GetVar(ctx, varAttempt).(int)
	fields := []zap.Field{zap.String("pool", pool), zap.String("replica", str(varReplica)),
		zap.String("reason", str(varReason)), zap.Duration("queue_wait", wait),
		zap.String("tenant", str(varTenant)), zap.String("band", str(varBand)), zap.Int("attempt", attempt)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	c.Write(fields...)
}
