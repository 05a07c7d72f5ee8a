package bench

import (
	"math"
	"testing"
	"time"
)

// quantile is the nearest rank: the ceil(q·n)-th smallest value. The
// published p50/p90/p99 rest on it at every n, the small ones included.
func TestReviewQuantileIsTheNearestRank(t *testing.T) {
	ms := func(vals ...int) []time.Duration {
		out := make([]time.Duration, len(vals))
		for i, v := range vals {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	seq := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i+1) * time.Millisecond
		}
		return out
	}
	for _, c := range []struct {
		name string
		d    []time.Duration
		q    float64
		want float64 // seconds
	}{
		{"p50 of none", nil, 0.5, 0},
		{"p50 of one", ms(7), 0.5, 0.007},
		{"p99 of one", ms(7), 0.99, 0.007},
		{"p50 of two: the lower", ms(1, 2), 0.5, 0.001},
		{"p90 of two: the higher", ms(1, 2), 0.9, 0.002},
		{"p50 of ten: the 5th", seq(10), 0.5, 0.005},
		{"p90 of ten: the 9th", seq(10), 0.9, 0.009},
		{"p99 of ten: the max", seq(10), 0.99, 0.010},
		{"p99 of 100: the 99th, not the max", seq(100), 0.99, 0.099},
		{"p29 of 100 (0.29·100 is 28.999… in floating point)", seq(100), 0.29, 0.029},
		{"max", seq(100), 1, 0.100},
		{"ties", ms(3, 3, 3, 3, 9), 0.5, 0.003},
	} {
		if got := quantile(c.d, c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: quantile %v, want %v", c.name, got, c.want)
		}
	}
}

// A summary of nothing is all zeros: no NaN, no Inf, no panic.
func TestReviewSummaryOfNoRequestsIsZeros(t *testing.T) {
	for _, replicas := range [][]string{nil, {"a", "b"}} {
		s := summarize("x", "", 1, replicas, nil)
		for name, v := range map[string]float64{"p50": s.P50, "p90": s.P90, "p99": s.P99, "max": s.Max,
			"ttfb p50": s.TTFBP50, "ttfb p99": s.TTFBP99, "throughput": s.Throughput} {
			if v != 0 {
				t.Errorf("replicas %v: %s %v, want 0", replicas, name, v)
			}
		}
		if s.Requests != 0 || s.OK != 0 || s.Lost != 0 || s.ReplicaMin != 0 || s.ReplicaMax != 0 || s.errorsString() != "0" {
			t.Errorf("replicas %v: %+v", replicas, s)
		}
	}
}

// Requests that failed are not in the latency percentiles (those are over
// the OK answers), but every one of them is counted: lost, or an error by
// status, a cut body apart.
func TestReviewFailedRequestsAreCountedNotTimed(t *testing.T) {
	recs := []Record{
		{Status: 200, Latency: 10 * time.Millisecond, Replica: "a"},
		{Status: 200, Latency: 20 * time.Millisecond, Replica: "b"},
		{Status: 503, Latency: time.Millisecond},
		{Status: 200, Latency: 5 * time.Second, Err: "body: unexpected EOF", Replica: "a"},
		{Status: 0, Latency: 60 * time.Second, Err: "Client.Timeout exceeded"},
	}
	s := summarize("x", "", 1, []string{"a", "b"}, recs)
	if s.Requests != 5 || s.OK != 2 || s.Lost != 1 || s.errorsString() != "200-cut×1 503×1" {
		t.Fatalf("requests %d ok %d lost %d errors %s; want 5, 2, 1, 200-cut×1 503×1", s.Requests, s.OK, s.Lost, s.errorsString())
	}
	if s.Max != 0.020 || s.P50 != 0.010 {
		t.Fatalf("p50 %v max %v: want the OK answers' 0.010 and 0.020", s.P50, s.Max)
	}
	if s.PerReplica["a"] != 1 || s.PerReplica["b"] != 1 {
		t.Fatalf("per replica %v: OK answers only", s.PerReplica)
	}
}

// Throughput is OK answers per second "from the first arrival to the last
// answer" (the report's words): a request that never got an answer, given
// up at the client timeout a minute later, is no answer and must not
// stretch the window.
func TestReviewThroughputWindowEndsAtTheLastAnswer(t *testing.T) {
	recs := []Record{
		{Start: 0, Status: 200, Latency: 500 * time.Millisecond},
		{Start: 500 * time.Millisecond, Status: 200, Latency: 500 * time.Millisecond},
		{Start: 600 * time.Millisecond, Status: 503, Latency: 400 * time.Millisecond}, // an answer: ends at 1 s
		{Start: 700 * time.Millisecond, Status: 0, Latency: 60 * time.Second, Err: "Client.Timeout exceeded"},
	}
	s := summarize("x", "", 1, nil, recs)
	if s.Throughput != 2 {
		t.Fatalf("throughput %v/s, want 2/s (2 OK over the 1 s to the last answer)", s.Throughput)
	}
}
