package loadaware

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// The session token is the client's: a token of a replica that left the
// set (or is down) never routes there, and an unknown token of any size
// steers nothing and is kept nowhere. (Regression test: passes before
// and after this review.)
func TestSessionTokenNeverRoutesToARemovedOrDownReplica(t *testing.T) {
	p := NewPicker(PickerConfig{Policy: Config{Weights: map[string]float64{SessionAffinity: 5, ActiveRequest: 1}}})
	p.SetReplicas([]string{"a:1", "b:1", "c:1"})
	ctx := context.Background()
	pick := func(token string) string {
		t.Helper()
		l, err := p.Pick(ctx, &lb.Request{Session: token})
		if err != nil {
			t.Fatal(err)
		}
		l.Release(lb.Outcome{Kind: lb.Cancelled})
		return l.Replica()
	}
	tokB := p.SessionToken("b:1")
	if got := pick(tokB); got != "b:1" {
		t.Fatalf("b's token went to %s", got)
	}
	p.Tracker().Acquire("b:1").Release(lb.Outcome{Kind: lb.Failure}) // b down (max_fails 1)
	for range 10 {
		if got := pick(tokB); got == "b:1" {
			t.Fatal("b's token went to b while b is down")
		}
	}
	p.SetReplicas([]string{"a:1", "c:1"})
	for range 10 {
		if got := pick(tokB); got == "b:1" {
			t.Fatal("b's token went to b after b left the set")
		}
	}
	for _, tok := range []string{strings.Repeat("x", 1<<20), "a:1", "\x00"} {
		if got := pick(tok); got != "a:1" && got != "c:1" {
			t.Fatalf("unknown token: picked %s", got)
		}
	}
	if n := len(*p.tokens.Load()); n != 2 {
		t.Fatalf("session tokens known: %d, want the set's 2 (client tokens must not be kept)", n)
	}
}
