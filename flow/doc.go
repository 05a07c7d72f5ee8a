// Package flow is the logic of the flow_control handler: Gateway API
// Inference Extension style flow control in front of reverse_proxy. It
// imports nothing from Caddy.
//
// While the pool has capacity a request passes straight through (the
// controller is work-conserving). When the saturation detector says the
// pool is saturated, requests wait in central queues, one per FlowKey
// (fairness id, priority), and are released when capacity returns in
// three tiers: strict priority between bands (higher first), the band's
// fairness policy between flows, the band's ordering policy within a flow
// (see package policies). When the pool is saturated, dispatch halts
// altogether: a lower band never overtakes a waiting higher one.
//
// Negative priorities are "sheddable" in the seed's sense: flow control
// queues them like any other band and sheds them only through their band's
// capacity limits, which the operator keeps small.
//
// Every request gets exactly one Outcome. All transitions happen under the
// Controller's single mutex and check a resolved flag, so a request that
// is dispatched, expires, is cancelled and is shut down "at the same
// time" still ends exactly once.
package flow
