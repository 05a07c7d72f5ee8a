package caddymodule

import (
	"context"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluice-router/sluice/lb"
)

// scriptedPicker answers each Pick with the next of its answers: a lease
// with a reason, or an error.
type scriptedPicker struct{ answers []answer }

type answer struct {
	replica, reason string
	err             error
}

func (p *scriptedPicker) SetReplicas([]string)     {}
func (p *scriptedPicker) InFlight() map[string]int { return nil }
func (p *scriptedPicker) Pick(_ context.Context, req *lb.Request) (lb.Lease, error) {
	a := p.answers[0]
	p.answers = p.answers[1:]
	if a.err != nil {
		return nil, a.err
	}
	req.Reason = a.reason
	return &recordingLease{addr: a.replica}, nil
}

// Each attempt's decision replaces the previous one's in the request's
// variables (the last attempt's replica wins; a refusal removes it), and
// each writes one debug line with the same fields.
func TestSelectRecordsEachAttemptsDecision(t *testing.T) {
	pk := &scriptedPicker{answers: []answer{
		{replica: "10.0.0.1:8000", reason: lb.ReasonLeastLatency},
		{replica: "10.0.0.2:8000", reason: lb.ReasonQueued},
		{err: lb.ErrQueueTimeout},
	}}
	core, logs := observer.New(zapcore.DebugLevel)
	s := &selector{module: "test", pool: lb.GetPool("decision-test"), varKey: "sluice.test.decision.",
		measure: measureAuto, log: zap.New(core), state: &policyState{picker: pk}}
	r, _, _ := newRequest(t)
	caddyhttp.SetVar(r.Context(), varTenant, "acme")
	caddyhttp.SetVar(r.Context(), varBand, "interactive")
	caddyhttp.SetVar(r.Context(), varQueueWait, time.Second) // flow_control's wait

	want := []struct {
		replica, reason string
	}{
		{"10.0.0.1:8000", "least_latency"},
		{"10.0.0.2:8000", "queued"},
		{"", "refused:queue_timeout"},
	}
	w := httptest.NewRecorder()
	for i, wt := range want {
		s.Select(nil, r, w)
		replica, _ := caddyhttp.GetVar(r.Context(), varReplica).(string)
		reason := caddyhttp.GetVar(r.Context(), varReason)
		attempt := caddyhttp.GetVar(r.Context(), varAttempt)
		wait, _ := caddyhttp.GetVar(r.Context(), varQueueWait).(time.Duration)
		if replica != wt.replica || reason != wt.reason || attempt != i+1 || wait < time.Second {
			t.Fatalf("attempt %d: replica %q reason %v attempt %v queue_wait %v, want %q %q %d and at least flow_control's 1s",
				i+1, replica, reason, attempt, wait, wt.replica, wt.reason, i+1)
		}
		lines := logs.FilterMessage("routing decision").All()
		if len(lines) != i+1 {
			t.Fatalf("%d debug lines after %d decisions", len(lines), i+1)
		}
		f := lines[i].ContextMap()
		if f["replica"] != wt.replica || f["reason"] != wt.reason || f["attempt"] != int64(i+1) ||
			f["tenant"] != "acme" || f["band"] != "interactive" || f["pool"] != "decision-test" || f["queue_wait"] != wait {
			t.Fatalf("debug line %d: %v", i+1, f)
		}
	}
	if w.Code != 503 {
		t.Fatalf("the refused attempt answered %d, want 503", w.Code)
	}
}

// Without DEBUG on the module's logger no line is written.
func TestDecisionLineOnlyAtDebug(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	r, _, _ := newRequest(t)
	logDecision(zap.New(core), r, "p", nil)
	if logs.Len() != 0 {
		t.Fatalf("%d lines at INFO", logs.Len())
	}
}

// A request through a Sluice policy adds only the decision's 4 variables
// to the request's vars map: Sluice's own per-request state (attempt
// records, the parsed body) lives elsewhere. With Caddy's own 4
// (trusted_proxy, client_ip, start_time, reverse_proxy's
// proxy_protocol_info) the map then stays within the 8 entries it holds
// before it grows, which it did on every request (a rehash and ~600 B).
func TestSelectAddsOnlyTheDecisionsVariables(t *testing.T) {
	pk := &scriptedPicker{answers: []answer{{replica: "10.0.0.1:8000", reason: lb.ReasonScore}}}
	s := &selector{module: "test", pool: lb.GetPool("vars-test"), varKey: "sluice.test.vars-test.",
		measure: measureAuto, maxBody: DefaultMaxBodyBytes, log: zap.NewNop(), state: &policyState{picker: pk}}
	r, _, _ := newRequest(t)
	r.Body = io.NopCloser(strings.NewReader(`{"prompt":"x","max_tokens":1}`))
	if s.Select(nil, r, httptest.NewRecorder()) == nil {
		t.Fatal("no upstream")
	}
	vars := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	var keys []string
	for k := range vars {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{varAttempt, varQueueWait, varReason, varReplica}
	if !slices.Equal(keys, want) {
		t.Fatalf("vars after a decision: %v, want only %v", keys, want)
	}
	// The state is still the request's: a retry finds the same record,
	// and the body read once.
	a := attemptFor(r, s.varKey, measureAuto)
	if a.req == nil || !a.req.Parsed {
		t.Fatalf("the retry does not find the first attempt's record: %+v", a.req)
	}
	if ri := requestInfoFor(r, DefaultMaxBodyBytes, true); !ri.Parsed || ri.limit != DefaultMaxBodyBytes {
		t.Fatal("the parsed body is not kept for the request")
	}
}
