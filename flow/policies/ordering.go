package policies

import (
	"fmt"
	"sort"
)

// OrderingPolicy decides, within one flow, which request is served first
// (tier 3). Less must be a strict total order on items with distinct Seq:
// irreflexive, asymmetric, transitive, and for a != b exactly one of
// Less(a, b), Less(b, a) holds. It must depend only on the items' fields,
// which do not change while queued, so a heap stays valid.
type OrderingPolicy interface {
	// Name is the policy's configuration name.
	Name() string
	// Less reports whether a is served before b.
	Less(a, b *Item) bool
}

// Ordering policy names, as written in the configuration.
const (
	FCFS        = "fcfs"
	EDF         = "edf"
	SLODeadline = "slo_deadline"
)

var orderings = map[string]OrderingPolicy{
	FCFS:        fcfs{},
	EDF:         edf{},
	SLODeadline: sloDeadline{},
}

// NewOrdering returns the ordering policy called name. Ordering policies
// are stateless, so one value may serve every band.
func NewOrdering(name string) (OrderingPolicy, error) {
	if p, ok := orderings[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("unknown ordering policy %q (want one of %v)", name, OrderingNames())
}

// OrderingNames lists the known ordering policies, sorted.
func OrderingNames() []string {
	names := make([]string, 0, len(orderings))
	for n := range orderings {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
