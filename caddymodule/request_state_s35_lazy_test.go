package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

// The parts of a request's state that only Sluice's handlers use (the
// kept client body, the watched response writer) are not carried by a
// plain reverse_proxy request. A handler must still find them whichever
// module made the state first: a policy (reverse_proxy, then a Sluice
// handler in handle_errors or handle_response), flow_control's body read
// (requestInfoFor before its watchBody), or the handler itself.
func TestS35HandlerPartsWhoeverMadeTheState(t *testing.T) {
	const body = `{"model":"m","prompt":"hello"}`
	// Each maker returns the writer the handlers below get.
	makers := map[string]func(w http.ResponseWriter, r *http.Request) http.ResponseWriter{
		"a policy, no body room": func(w http.ResponseWriter, r *http.Request) http.ResponseWriter { requestStateFor(r); return w },
		"a body read":            func(w http.ResponseWriter, r *http.Request) http.ResponseWriter { requestInfoFor(r, 1, true); return w },
		"keepClientBody":         func(w http.ResponseWriter, r *http.Request) http.ResponseWriter { keepClientBody(r); return w },
		"watchBody":              watchBody, // flow_control in front of custom_router
	}
	for name, makeState := range makers {
		t.Run(name, func(t *testing.T) {
			r, _, _ := newRequest(t)
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
			rec := httptest.NewRecorder()
			outer := makeState(rec, r)
			keepClientBody(r) // custom_router
			kept := r.Body
			keepClientBody(r) // a second handler keeps the first one's
			if r.Body != kept {
				t.Fatal("a second keepClientBody wrapped the body again")
			}
			w := watchBody(outer, r)
			if again := watchBody(w, r); again != w {
				t.Fatal("a second watchBody wrapped the writer again")
			}
			rs, _ := requestStateFor(r)
			if !rs.watched() {
				t.Fatal("the writer is not watched")
			}

			// The policy reads the body whole on reverse_proxy's copy,
			// and the attempt is sent.
			proxied := r.WithContext(r.Context())
			if ri := requestInfoFor(proxied, 1<<20, true); !ri.Parsed || ri.Model != "m" {
				t.Fatalf("the policy did not parse the body: %+v", ri.Request)
			}
			ri := requestInfoFor(proxied, 1<<20, true)
			ri.bodyFor(proxied)
			if got, _ := io.ReadAll(proxied.Body); string(got) != body {
				t.Fatalf("the attempt sends %q, want %q", got, body)
			}
			if name != "a body read" {
				// The client's request gives the body again, for a
				// handle_errors reverse_proxy (a body read before it
				// was kept is not the kept body's to give).
				if got, _ := io.ReadAll(r.Body); string(got) != body {
					t.Fatalf("the fallback gets %q, want %q", got, body)
				}
			}

			// An attempt begun now learns from the body's first write.
			lease := &s35FirstByteLease{recordingLease: recordingLease{addr: "10.0.0.1:8000"}}
			s := &selector{module: "test", pool: lb.GetPool("s35-parts"), varKey: "sluice.test.s35-parts",
				measure: measureAuto, maxBody: 1 << 20, log: zap.NewNop(),
				state: &policyState{picker: s35Picker{lease}}, readAhead: new(atomic.Bool)}
			if up := s.Select(nil, proxied, w); up == nil {
				t.Fatal("no upstream")
			}
			a := rs.attempt(s.varKey)
			a.mu.Lock()
			tr := a.trace
			a.mu.Unlock()
			if !tr.bodyWatched {
				t.Fatal("the attempt does not know its body is watched")
			}
			httptrace.ContextClientTrace(proxied.Context()).GotFirstResponseByte()
			if lease.firstBytes.Load() != 0 {
				t.Fatal("a watched attempt learned from the headers' first byte")
			}
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("data: {}\n\n"))
			if tr.bodyBegan() <= 0 || lease.firstBytes.Load() != 1 {
				t.Fatalf("body's first byte %v, lease told %d times; want it noted once", tr.bodyBegan(), lease.firstBytes.Load())
			}
			if rec.Body.String() != "data: {}\n\n" {
				t.Fatalf("the client got %q", rec.Body.String())
			}
		})
	}
}

// A plain reverse_proxy request (no Sluice handler) keeps and watches
// nothing, and a policy's whole read of its body leaves it as it was.
func TestS35PlainRequestKeepsAndWatchesNothing(t *testing.T) {
	const body = `{"model":"m","prompt":"hello"}`
	r, _, _ := newRequest(t)
	orig := io.NopCloser(strings.NewReader(body))
	r.Body, r.ContentLength = orig, int64(len(body))
	proxied := r.WithContext(r.Context())
	if ri := requestInfoFor(proxied, 1<<20, true); !ri.Parsed {
		t.Fatal("not parsed")
	}
	rs, _ := requestStateFor(r)
	if rs.watched() || rs.bodyKept() {
		t.Fatalf("watched %v, kept %v without a Sluice handler", rs.watched(), rs.bodyKept())
	}
	if rs.body != nil || rs.out != nil {
		t.Fatal("a plain reverse_proxy request carries a Sluice handler's parts")
	}
	if r.Body != orig {
		t.Fatal("the client's body was replaced without a Sluice handler")
	}
}

// s35FirstByteLease counts the first bytes it is told of.
type s35FirstByteLease struct {
	recordingLease
	firstBytes atomic.Int32
}

func (l *s35FirstByteLease) FirstByte(time.Duration) { l.firstBytes.Add(1) }

type s35Picker struct{ l *s35FirstByteLease }

func (s35Picker) SetReplicas([]string)                                  {}
func (s35Picker) InFlight() map[string]int                              { return nil }
func (p s35Picker) Pick(context.Context, *lb.Request) (lb.Lease, error) { return p.l, nil }
