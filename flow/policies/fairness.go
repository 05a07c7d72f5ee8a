package policies

import (
	"fmt"
	"sort"
)

// FairnessPolicy decides which flow of one band is served next (tier 2).
// Each band has its own instance, created by NewFairness.
//
// The framework tells the policy about every change to a flow through
// Update, and asks for the next flow through Next. Next only peeks: when
// the gate is closed nothing is dispatched and the turn must not move.
type FairnessPolicy interface {
	// Name is the policy's configuration name.
	Name() string
	// Next returns the backlogged flow whose turn it is, nil when no flow
	// of the band has items. Calling it twice without an Update in
	// between returns the same flow.
	Next() *Queue
	// Update is called after every change to q: an item pushed or removed
	// (expired, cancelled, shut down), or dispatched, in which case served
	// is true. q.Len() == 0 means q has left the backlog; the framework
	// may drop an empty queue, so the policy must forget it.
	Update(q *Queue, served bool)
}

// Fairness policy names, as written in the configuration.
const (
	RoundRobin   = "round_robin"
	GlobalStrict = "global_strict"
)

var fairness = map[string]func(OrderingPolicy) FairnessPolicy{
	RoundRobin:   func(OrderingPolicy) FairnessPolicy { return newRoundRobin() },
	GlobalStrict: func(o OrderingPolicy) FairnessPolicy { return newGlobalStrict(o) },
}

// NewFairness returns a fresh fairness policy called name for a band whose
// flows are ordered by ord.
func NewFairness(name string, ord OrderingPolicy) (FairnessPolicy, error) {
	if f, ok := fairness[name]; ok {
		return f(ord), nil
	}
	return nil, fmt.Errorf("unknown fairness policy %q (want one of %v)", name, FairnessNames())
}

// FairnessNames lists the known fairness policies, sorted.
func FairnessNames() []string {
	names := make([]string, 0, len(fairness))
	for n := range fairness {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
