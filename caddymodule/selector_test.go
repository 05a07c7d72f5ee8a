package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/sluice-router/sluice/lb"
)

// panicPicker stands in for a policy with a bug: it panics, or hands out
// a lease that counts its releases.
type panicPicker struct {
	panicInPick bool
	lease       *recordingLease
}

func (p *panicPicker) SetReplicas([]string)     {}
func (p *panicPicker) InFlight() map[string]int { return nil }
func (p *panicPicker) Pick(context.Context, *lb.Request) (lb.Lease, error) {
	if p.panicInPick {
		panic("bug in Pick")
	}
	return p.lease, nil
}

// A panic in a policy answers 500 with the JSON body and releases what the
// request holds exactly once: never a leaked slot, never a dead connection.
func TestPanicInAPolicyAnswers500AndReleasesItsSlot(t *testing.T) {
	for _, where := range []string{"pick", "after pick"} {
		t.Run(where, func(t *testing.T) {
			pk := &panicPicker{panicInPick: where == "pick", lease: &recordingLease{addr: "127.0.0.1:1"}}
			s := &selector{module: "test", pool: lb.GetPool("panic-test"), varKey: "sluice.test.panic." + where,
				measure: measureAuto, log: zap.NewNop(), state: &policyState{picker: pk}}
			if where == "after pick" {
				s.afterPick = func(http.ResponseWriter, lb.Lease) { panic("bug after the pick") }
			}
			r, _, cancel := newRequest(t)
			w := httptest.NewRecorder()
			if up := s.Select(nil, r, w); up != nil {
				t.Fatal("an upstream was returned after a panic")
			}
			if w.Code != 500 || !strings.Contains(w.Body.String(), `"type":"internal"`) {
				t.Fatalf("answer %d %q, want 500 with the JSON error", w.Code, w.Body.String())
			}
			cancel() // the request ends
			if where == "after pick" {
				if got := waitOutcomes(t, pk.lease, 1); len(got) != 1 {
					t.Fatalf("lease released %d times", len(got))
				}
			}
		})
	}
}
