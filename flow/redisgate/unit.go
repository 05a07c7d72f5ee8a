package redisgate

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/sluice-router/sluice/flow"
	"github.com/sluice-router/sluice/lb/redisconn"
)

// The pool's capacity is counted in requests or in tokens
// (concurrency_mode), and the two are no common unit: 3 requests read as
// 3 tokens let a tokens-mode instance over-admit, and 30,000 tokens read
// as 30,000 requests made the pool look full to a requests-mode one for
// as long as they were held. So each unit has its own records in Redis
// (KeysForUnit), and an instance counts only the holders of its own unit.
//
// A reload that switches concurrency_mode (on one instance, or on each in
// turn during a rolling change): at its next claim the instance stops
// dispatching on what it was allowed in the old unit, leaves the old
// unit's records holding what it has in flight there (so instances still
// on the old unit see it), and claims in the new unit, counting what is in
// flight in that unit. Its old record is not renewed: it lapses within a
// lease. Until every instance runs the new mode, each mode admits up to
// the pool's capacity in its own unit (the pool may hold up to both, for
// at most the change plus a lease): over-admission that drains, where a
// mixed count froze or over-admitted for as long as units were held.

// KeysForUnit are the keys of pool under prefix for the unit its capacity
// is counted in. Requests keep the keys they always had (KeysFor), so a
// requests-mode pool needs no migration; tokens have their own, in the
// same hash slot.
func KeysForUnit(prefix, pool string, tokens bool) Keys {
	if !tokens {
		return KeysFor(prefix, pool)
	}
	return keysUnder(redisconn.KeyTag(prefix, pool) + ":flow:tokens:")
}

// unitIndex indexes what the gate keeps per unit: 0 requests, 1 tokens.
func unitIndex(tokens bool) int {
	if tokens {
		return 1
	}
	return 0
}

// unitsOf is in counted in tokens, or in requests.
func unitsOf(in flow.InFlight, tokens bool) int64 {
	if tokens {
		return in.Tokens
	}
	return in.Requests
}

// setAllowed sets what the controller may have in flight, in tokens or
// requests. allowed is written before its unit and read after it
// (allowedIn), so a reader that sees the new unit sees the new amount.
func (g *Gate) setAllowed(units int64, tokens bool) (before int64) {
	before = g.allowed.Swap(units)
	g.allowedTokens.Store(tokens)
	return before
}

// allowedIn is what the controller may have in flight, in the unit asked
// for: 0 while allowed still counts the other one (a switch not yet
// claimed for), so nothing is dispatched on a figure of the other unit.
func (g *Gate) allowedIn(tokens bool) int64 {
	if g.allowedTokens.Load() != tokens {
		return 0
	}
	return g.allowed.Load()
}

// leaveUnit gives back this instance's record in one unit down to inUse,
// what it has in flight counted in that unit; not renewed, that lapses
// within a lease. The capacity is unknown in that unit and takes no part:
// wanting nothing, the instance is entitled to nothing.
func (g *Gate) leaveUnit(ctx context.Context, cl rueidis.Client, tokens bool, inUse int64) error {
	cfg := g.Config()
	i := unitIndex(tokens)
	cctx, cancel := context.WithTimeout(ctx, cfg.Conn.ReadTimeout)
	defer cancel()
	res, err := claim(cctx, cl, g.keys[i], cfg.Instance, inUse, 0, "", 0, cfg.LeaseTTL, g.seen[i])
	if err != nil {
		return err
	}
	g.seen[i] = res.seen
	return nil
}
