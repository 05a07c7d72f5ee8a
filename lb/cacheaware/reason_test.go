package cacheaware

import (
	"strings"
	"testing"

	"github.com/sluice-router/sluice/lb"
	"github.com/sluice-router/sluice/lb/tracker"
)

// Each rule that can choose names itself in req.Reason.
func TestPickSaysWhichRuleChose(t *testing.T) {
	p := newPicker(t, "a:1", "b:1")
	text := strings.Repeat("a shared system prompt ", 4)
	first := prompt(text)
	pickFor(t, p, first).Release(ok)
	if first.Reason != lb.ReasonLeastLoad {
		t.Fatalf("a new prompt: reason %q, want %q", first.Reason, lb.ReasonLeastLoad)
	}
	again := prompt(text + "and a question")
	pickFor(t, p, again).Release(ok)
	if again.Reason != lb.ReasonPrefixMatch {
		t.Fatalf("a cached prefix: reason %q, want %q", again.Reason, lb.ReasonPrefixMatch)
	}

	// Three requests of one prompt held on its replica, none on the
	// other: the fourth finds the pool imbalanced past both thresholds.
	p = NewPicker(Config{BalanceAbsThreshold: 2, BalanceRelThreshold: 1.5}, tracker.Config{})
	p.SetReplicas([]string{"a:1", "b:1"})
	for i := 0; i < 3; i++ {
		pickFor(t, p, prompt(text))
	}
	imb := prompt(text)
	pickFor(t, p, imb)
	if imb.Reason != lb.ReasonImbalanced {
		t.Fatalf("an imbalanced pool: reason %q, want %q", imb.Reason, lb.ReasonImbalanced)
	}

	p = NewPicker(Config{MissPolicy: MissSmallestTree}, tracker.Config{})
	p.SetReplicas([]string{"a:1", "b:1"})
	miss, bare := prompt(text), &lb.Request{}
	pickFor(t, p, miss)
	pickFor(t, p, bare)
	if miss.Reason != lb.ReasonSmallestTree || bare.Reason != lb.ReasonLeastLoad {
		t.Fatalf("smallest_tree: reasons %q (a prompt) and %q (none), want %q and %q",
			miss.Reason, bare.Reason, lb.ReasonSmallestTree, lb.ReasonLeastLoad)
	}
}
