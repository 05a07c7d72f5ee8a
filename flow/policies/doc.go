// Package policies holds the plugins of flow control's three-tier dispatch
// and the per-flow queue they operate on. The framework (package flow)
// owns bands, capacity and the gate; it asks a FairnessPolicy which flow
// of a band goes next (tier 2) and keeps each flow's Queue ordered by the
// band's OrderingPolicy (tier 3). Tier 1, strict priority between bands,
// is not pluggable.
//
// Policies are not safe for concurrent use: the framework calls them under
// its own lock.
package policies
