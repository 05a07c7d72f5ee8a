package redisgate

import (
	"testing"

	"github.com/sluice-router/sluice/flow"
)

// The shares come back from Redis, written from claims of every instance
// (of any version): a share that is not a finite amount ≥ 0 is no share.
// An infinite one made its flow the furthest below its share for ever,
// first in its band ahead of every other backlogged flow.
func TestParseSharesKeepsOnlyFiniteShares(t *testing.T) {
	names := map[string]string{}
	for _, id := range []string{"ok", "inf", "nan", "neg", "huge"} {
		names[flowName(id)] = id
	}
	lines := "0\t" + flowName("ok") + "\t2.5\n" +
		"0\t" + flowName("inf") + "\tinf\n" +
		"0\t" + flowName("nan") + "\tnan\n" +
		"0\t" + flowName("neg") + "\t-1\n" +
		"0\t" + flowName("huge") + "\t1e400\n" +
		"junk\n"
	s := parseShares(lines, names, false)
	want := map[flow.FlowKey]float64{{Priority: 0, FlowID: "ok"}: 2.5}
	if len(s.Of) != len(want) || s.Of[flow.FlowKey{FlowID: "ok"}] != 2.5 {
		t.Fatalf("shares %v, want only %v", s.Of, want)
	}
}
