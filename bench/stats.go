package bench

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"
)

// Summary is one system's result in a scenario.
type Summary struct {
	System      string `json:"system"`
	Description string `json:"description"`
	Rep         int    `json:"rep"` // repetition (1-based; see Options.Reps)
	Proxies     int    `json:"proxies"`
	Requests    int    `json:"requests"`
	OK          int    `json:"ok"`   // 200 with a complete body
	Lost        int    `json:"lost"` // no HTTP answer at all
	// Errors counts answered requests that are not OK, by status
	// ("200-cut" for a body cut short).
	Errors map[string]int `json:"errors_by_status"`
	// Latency percentiles (seconds) over the OK requests, to the last byte.
	P50 float64 `json:"p50_s"`
	P90 float64 `json:"p90_s"`
	P99 float64 `json:"p99_s"`
	Max float64 `json:"max_s"`
	// TTFBP50/P99: time to first byte, over the OK requests.
	TTFBP50 float64 `json:"ttfb_p50_s"`
	TTFBP99 float64 `json:"ttfb_p99_s"`
	// Throughput is OK requests per second of wall time, from the first
	// arrival to the last answer.
	Throughput float64 `json:"throughput_rps"`
	// PerReplica counts OK requests per replica of the fleet (zeros too);
	// ReplicaMin/Max are its spread.
	PerReplica map[string]int `json:"per_replica"`
	ReplicaMin int            `json:"replica_min"`
	ReplicaMax int            `json:"replica_max"`
	// Extra holds the scenario's own measures (hit rate, scale-up time…).
	Extra map[string]float64 `json:"extra,omitempty"`
	// Notes are warnings about this system's run (action errors…).
	Notes []string `json:"notes,omitempty"`

	latencies []time.Duration // sorted, OK requests only; for the plot
}

func summarize(system, desc string, proxies int, replicas []string, recs []Record) Summary {
	s := Summary{System: system, Description: desc, Proxies: proxies, Requests: len(recs),
		Errors: map[string]int{}, PerReplica: map[string]int{}, Extra: map[string]float64{}}
	for _, r := range replicas {
		s.PerReplica[r] = 0
	}
	var ttfb []time.Duration
	var first, last time.Duration = -1, 0
	for _, r := range recs {
		if first < 0 || r.Start < first {
			first = r.Start
		}
		if !r.Lost() {
			// The window ends at the last answer: a request given up at
			// the client timeout got none and must not stretch it.
			last = max(last, r.Start+r.Latency)
		}
		switch {
		case r.Lost():
			s.Lost++
		case r.Status == 200 && r.Err == "":
			s.OK++
			s.latencies = append(s.latencies, r.Latency)
			ttfb = append(ttfb, r.TTFB)
			s.PerReplica[r.Replica]++
		case r.Status == 200:
			s.Errors["200-cut"]++
		default:
			s.Errors[strconv.Itoa(r.Status)]++
		}
	}
	slices.Sort(s.latencies)
	slices.Sort(ttfb)
	s.P50, s.P90, s.P99 = quantile(s.latencies, 0.5), quantile(s.latencies, 0.9), quantile(s.latencies, 0.99)
	s.Max = quantile(s.latencies, 1)
	s.TTFBP50, s.TTFBP99 = quantile(ttfb, 0.5), quantile(ttfb, 0.99)
	if wall := last - max(first, 0); wall > 0 {
		s.Throughput = float64(s.OK) / wall.Seconds()
	}
	s.ReplicaMin, s.ReplicaMax = -1, 0
	for _, n := range s.PerReplica {
		if s.ReplicaMin < 0 || n < s.ReplicaMin {
			s.ReplicaMin = n
		}
		s.ReplicaMax = max(s.ReplicaMax, n)
	}
	s.ReplicaMin = max(s.ReplicaMin, 0)
	return s
}

// quantile of sorted d (nearest rank), in seconds; 0 when empty.
func quantile(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	i := int(q*float64(len(d)) + 0.999999)
	i = min(max(i-1, 0), len(d)-1)
	return d[i].Seconds()
}

func (s Summary) errorsString() string {
	if len(s.Errors) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(s.Errors))
	for k := range s.Errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := ""
	for i, k := range keys {
		if i > 0 {
			out += " "
		}
		out += fmt.Sprintf("%s×%d", k, s.Errors[k])
	}
	return out
}
