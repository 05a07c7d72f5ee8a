package redisgate

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-router/sluice/flow"
)

// maxDemandLines bounds what one instance writes to Redis per claim: its
// largest flows by priority, then units; the rest of each band is one
// line (flow restFlow).
const (
	maxDemandLines = 64
	restFlow       = "~"
)

// encodeDemand is an instance's demand as the claim script reads it: one
// line per flow, "<priority>\t<flow>\t<units>", units being in flight +
// queued (requests, or tokens). A flow is named by a hash of its id:
// fixed length, and no client-chosen byte reaches the encoding.
func encodeDemand(flows []flow.FlowDemand, tokens bool) string {
	type line struct {
		prio  int
		flow  string
		units int64
	}
	var lines []line
	for _, f := range flows {
		u := f.InFlight.Requests + f.Queued.Requests
		if tokens {
			u = f.InFlight.Tokens + f.Queued.Tokens
		}
		if u > 0 {
			lines = append(lines, line{f.Priority, flowName(f.FlowID), u})
		}
	}
	slices.SortFunc(lines, func(a, b line) int {
		return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(b.units, a.units), cmp.Compare(a.flow, b.flow))
	})
	if len(lines) > maxDemandLines {
		kept, rest := lines[:maxDemandLines-1], lines[maxDemandLines-1:]
		merged := map[int]int64{}
		var prios []int
		for _, l := range rest {
			if _, ok := merged[l.prio]; !ok {
				prios = append(prios, l.prio)
			}
			merged[l.prio] += l.units
		}
		lines = kept
		for _, p := range prios {
			lines = append(lines, line{p, restFlow, merged[p]})
		}
	}
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "%d\t%s\t%d\n", l.prio, l.flow, l.units)
	}
	return b.String()
}

// flowName is the flow's name in Redis, the same on every instance: 32
// hex digits of its id's SHA-256. A client may choose its id, so the hash
// must resist collisions: under FNV-64a (before) one could pick an id
// that merged its flow with another tenant's.
func flowName(id string) string {
	var buf [128]byte // spares an allocation for ids up to its size
	sum := sha256.Sum256(append(buf[:0], id...))
	return hex.EncodeToString(sum[:16])
}

// parseShares reads the claim's per-flow shares of this instance (in
// tokens when tokens is set), naming each flow by its id again (names:
// flowName → id); the summed rest of a band has no id and is left out.
func parseShares(lines string, names map[string]string, tokens bool) *flow.FlowShares {
	m := map[flow.FlowKey]float64{}
	for _, l := range strings.Split(lines, "\n") {
		f := strings.Split(l, "\t")
		if len(f) != 3 {
			continue
		}
		p, err1 := strconv.Atoi(f[0])
		v, err2 := strconv.ParseFloat(f[2], 64)
		id, ok := names[f[1]]
		// A share is a finite amount ≥ 0: an infinite one would put its
		// flow first in its band for ever (a reply is outside input).
		if err1 != nil || err2 != nil || !ok || !(v >= 0) || math.IsInf(v, 1) {
			continue
		}
		m[flow.FlowKey{Priority: p, FlowID: id}] += v
	}
	return &flow.FlowShares{Tokens: tokens, Of: m}
}
