package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluice-router/sluice/lb"
)

// queued_least_latency's view of a replica in the health answer has what
// docs/api.md shows: its streams' first-byte EWMA and the learned
// concurrency limit its slots come from, beside the rest.
func TestQLLHealthShowsStreamLatencyAndTheLearnedLimit(t *testing.T) {
	cctx := provisionContext(t)
	name := freshPoolName("health-qll-limit")
	bs, err := lb.ParseBackends([]string{"http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	lb.GetPool(name).Set(bs)
	q := &QueuedLeastLatency{Pool: name}
	if err := q.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer q.Cleanup()
	rec := httptest.NewRecorder()
	serveHealth(rec, httptest.NewRequest(http.MethodGet, "/_custom_router/health", nil), name)
	var body struct {
		Backends []map[string]any `json:"backends"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || len(body.Backends) != 1 {
		t.Fatalf("health %d %s (%v)", rec.Code, rec.Body, err)
	}
	b := body.Backends[0]
	for _, k := range []string{"ewma_latency", "ewma_first_byte_stream", "concurrency_limit", "parallelism", "slots_from"} {
		if _, ok := b[k]; !ok {
			t.Errorf("health's replica lacks %q: %v", k, b)
		}
	}
	if lim, _ := b["concurrency_limit"].(float64); lim < 1 {
		t.Errorf("concurrency_limit %v, want the learned limit (at least 1)", b["concurrency_limit"])
	}
}
